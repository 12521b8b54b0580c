#include "scheduler/placement.h"

#include <vector>

#include "gtest/gtest.h"

namespace specserve::scheduler {
namespace {

namespace v1 = specserve::v1;

WorkerLoad Load(bool available, uint64_t used, uint64_t budget,
                uint32_t bursts = 0, uint32_t sessions = 0) {
  WorkerLoad w;
  w.available = available;
  w.memory_used_bytes = used;
  w.memory_budget_bytes = budget;
  w.active_bursts = bursts;
  w.sessions = sessions;
  return w;
}

TEST(PlacementTest, NewSessionGoesToLeastLoaded) {
  std::vector<WorkerLoad> workers = {Load(true, 60, 100), Load(true, 20, 100),
                                     Load(true, 40, 100)};
  auto p = PlaceSession(v1::NEW, -1, workers);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->worker, 1);
  EXPECT_TRUE(p->rebuild);
}

TEST(PlacementTest, BurstsCountTowardLoad) {
  // Same memory; worker 0 runs many bursts.
  std::vector<WorkerLoad> workers = {Load(true, 20, 100, 10),
                                     Load(true, 20, 100, 1)};
  EXPECT_EQ(PlaceSession(v1::NEW, -1, workers)->worker, 1);
}

TEST(PlacementTest, TiesGoToFewerSessionsThenLowerIndex) {
  std::vector<WorkerLoad> workers = {
      Load(true, 0, 0, 0, 5), Load(true, 0, 0, 0, 2), Load(true, 0, 0, 0, 2)};
  EXPECT_EQ(PlaceSession(v1::NEW, -1, workers)->worker, 1);
}

TEST(PlacementTest, ResidentSessionsStayWhileTheirWorkerIsUp) {
  std::vector<WorkerLoad> workers = {Load(true, 90, 100), Load(true, 0, 100)};
  for (v1::Residency r : {v1::ACTIVE, v1::PARKED, v1::OFFLOADED}) {
    auto p = PlaceSession(r, 0, workers);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->worker, 0);
    EXPECT_FALSE(p->rebuild);
  }
}

TEST(PlacementTest, SessionOnADeadWorkerIsRebuiltElsewhere) {
  std::vector<WorkerLoad> workers = {Load(false, 0, 100), Load(true, 50, 100),
                                     Load(true, 10, 100)};
  auto p = PlaceSession(v1::PARKED, 0, workers);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->worker, 2);
  EXPECT_TRUE(p->rebuild);
}

TEST(PlacementTest, LostSessionGoesToAnyAvailableWorker) {
  // Even its old worker, if that one is back and least loaded.
  std::vector<WorkerLoad> workers = {Load(true, 0, 100), Load(true, 50, 100)};
  auto p = PlaceSession(v1::LOST, 0, workers);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->worker, 0);
  EXPECT_TRUE(p->rebuild);
}

TEST(PlacementTest, FullWorkersAreAvoidedButUsedAsLastResort) {
  std::vector<WorkerLoad> workers = {Load(true, 10, 100, 50),  // busy
                                     Load(true, 99, 100, 0)};  // full
  // Score of 0 is 0.1 + 2.5; of 1 is 0.99: 1 would win on score, but it is
  // full.
  EXPECT_EQ(PlaceSession(v1::NEW, -1, workers)->worker, 0);
  workers[0].available = false;
  EXPECT_EQ(PlaceSession(v1::NEW, -1, workers)->worker, 1);
}

TEST(PlacementTest, NoWorkerAvailable) {
  std::vector<WorkerLoad> none = {Load(false, 0, 100), Load(false, 0, 100)};
  auto p = PlaceSession(v1::NEW, -1, none);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(p.status().message(), "no worker available");
  EXPECT_EQ(PlaceSession(v1::LOST, 0, {}).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(PlacementTest, OutOfRangeWorkerIndexIsTreatedAsLost) {
  std::vector<WorkerLoad> workers = {Load(true, 0, 100)};
  auto p = PlaceSession(v1::PARKED, 7, workers);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->worker, 0);
  EXPECT_TRUE(p->rebuild);
}

TEST(PlacementTest, ClosedSessionsAreNotPlaced) {
  std::vector<WorkerLoad> workers = {Load(true, 0, 100)};
  EXPECT_EQ(PlaceSession(v1::CLOSED, 0, workers).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(PlacementTest, FromInfo) {
  specserve::worker::v1::WorkerInfo info;
  info.set_memory_budget_bytes(1000);
  info.set_memory_used_bytes(250);
  info.set_active_bursts(3);
  info.set_sessions(4);
  WorkerLoad w = WorkerLoad::FromInfo(true, info);
  EXPECT_TRUE(w.available);
  EXPECT_EQ(w.memory_used_bytes, 250u);
  EXPECT_EQ(w.sessions, 4u);
  EXPECT_DOUBLE_EQ(LoadScore(w, PlacementOptions()), 0.25 + 0.03);
}

// Sessions placed one after another, with the polled figures never
// refreshed (polls lag a burst of new sessions), spread evenly.
TEST(PlacementTest, LivePlacedCountsSpreadABurstOfNewSessions) {
  std::vector<WorkerLoad> workers = {Load(true, 0, 1000), Load(true, 0, 1000),
                                     Load(true, 0, 1000)};
  for (int n = 0; n < 30; ++n) {
    auto p = PlaceSession(v1::NEW, -1, workers);
    ASSERT_TRUE(p.ok());
    ++workers[p->worker].placed_sessions;
  }
  for (const WorkerLoad& w : workers) EXPECT_EQ(w.placed_sessions, 10u);
}

// The memory estimate counts sessions placed since the last poll at the
// polled bytes per session: a worker whose budget they fill is skipped.
TEST(PlacementTest, PlacedSessionsFillTheMemoryEstimate) {
  // Worker 0 polled 2 sessions in 400 of 1000 bytes; the scheduler has
  // placed 5 there since (5 x 200 = 1000: full). Worker 1 is busier in
  // bursts but has room.
  WorkerLoad a = Load(true, 400, 1000, 0, 2);
  a.placed_sessions = 5;
  WorkerLoad b = Load(true, 500, 1000, 8, 5);
  b.placed_sessions = 5;
  EXPECT_DOUBLE_EQ(EstimatedMemoryFraction(a), 1.0);
  EXPECT_DOUBLE_EQ(EstimatedMemoryFraction(b), 0.5);
  std::vector<WorkerLoad> workers = {a, b};
  EXPECT_EQ(PlaceSession(v1::NEW, -1, workers)->worker, 1);
}

}  // namespace
}  // namespace specserve::scheduler
