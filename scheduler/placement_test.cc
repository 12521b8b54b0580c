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

// ---------------------------------------------------------------------------
// Prefix-aware placement of a new session (PlaceNewSession)

// An available worker of unknown memory holding `placed` sessions: its
// load is session_weight x placed.
WorkerLoad Placed(uint32_t placed) {
  WorkerLoad w = Load(true, 0, 0);
  w.placed_sessions = placed;
  return w;
}

std::vector<WorkerLoad> PlacedLoads(std::vector<uint32_t> placed) {
  std::vector<WorkerLoad> workers;
  for (uint32_t n : placed) workers.push_back(Placed(n));
  return workers;
}

constexpr uint32_t kShortPrefix = 64;  // a short system prompt's checkpoint

// Thirty new sessions one after another whose prompts share a short system
// prompt: a worker holds the prefix once it has prefilled it, and each
// later first turn can resume from it on any holder.
TEST(PrefixPlacementTest, SessionsSharingAPrefixSpreadAndEachWorkerPrefillsIt) {
  std::vector<WorkerLoad> workers = PlacedLoads({0, 0, 0});
  std::vector<uint32_t> cached = {0, 0, 0};
  int prefills = 0;
  for (int n = 0; n < 30; ++n) {
    absl::StatusOr<PrefixPlacement> p = PlaceNewSession(workers, cached);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->cached_tokens, cached[p->worker]);
    if (p->cached_tokens == 0) ++prefills;
    ++workers[p->worker].placed_sessions;
    cached[p->worker] = kShortPrefix;
  }
  for (const WorkerLoad& w : workers) {
    EXPECT_NEAR(w.placed_sessions, 10, 2);
  }
  EXPECT_EQ(prefills, 3);
}

// The same with only the first worker ever holding the prefix (forks at a
// position only the source keeps): the imbalance stays bounded all the
// same.
TEST(PrefixPlacementTest, ASingleHolderTakesNoMoreThanItsShare) {
  std::vector<WorkerLoad> workers = PlacedLoads({0, 0, 0});
  const std::vector<uint32_t> cached = {kShortPrefix, 0, 0};
  for (int n = 0; n < 30; ++n) {
    absl::StatusOr<PrefixPlacement> p = PlaceNewSession(workers, cached);
    ASSERT_TRUE(p.ok()) << p.status();
    ++workers[p->worker].placed_sessions;
  }
  for (const WorkerLoad& w : workers) {
    EXPECT_NEAR(w.placed_sessions, 10, 2);
  }
}

TEST(PrefixPlacementTest, AHitWinsWhileLoadsAreBalanced) {
  const std::vector<uint32_t> cached = {0, 0, kShortPrefix};
  auto p = PlaceNewSession(PlacedLoads({5, 5, 5}), cached);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->worker, 2);
  EXPECT_EQ(p->cached_tokens, kShortPrefix);
  // Within prefix_balance_sessions of the least loaded: still the holder.
  EXPECT_EQ(PlaceNewSession(PlacedLoads({5, 6, 7}), cached)->worker, 2);
  // Past it, a short prefix is worth less than the imbalance: the least
  // loaded worker prefills it.
  p = PlaceNewSession(PlacedLoads({5, 6, 8}), cached);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->worker, 0);
  EXPECT_EQ(p->cached_tokens, 0u);
}

TEST(PrefixPlacementTest, ALongPrefixOutweighsASmallImbalance) {
  // Five sessions more than the least loaded worker: beyond what any hit
  // is worth by itself (2), within what 4,096 saved tokens add (4).
  const std::vector<WorkerLoad> workers = PlacedLoads({2, 7, 3});
  auto p = PlaceNewSession(workers, std::vector<uint32_t>{0, 4096, 0});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->worker, 1);
  EXPECT_EQ(p->cached_tokens, 4096u);
  p = PlaceNewSession(workers, std::vector<uint32_t>{0, kShortPrefix, 0});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->worker, 0);
  EXPECT_EQ(p->cached_tokens, 0u);
  // Ten sessions more outweigh even the long prefix.
  p = PlaceNewSession(PlacedLoads({2, 12, 3}),
                      std::vector<uint32_t>{0, 4096, 0});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->worker, 0);
}

TEST(PrefixPlacementTest, TheThresholdsAreOptions) {
  const std::vector<WorkerLoad> workers = PlacedLoads({2, 7});
  const std::vector<uint32_t> cached = {0, kShortPrefix};
  EXPECT_EQ(PlaceNewSession(workers, cached)->worker, 0);
  PlacementOptions generous;
  generous.prefix_balance_sessions = 5;
  EXPECT_EQ(PlaceNewSession(workers, cached, generous)->worker, 1);
  PlacementOptions cheap_prefill;
  cheap_prefill.prefix_tokens_per_session = 16;  // 64 tokens: 4 sessions
  EXPECT_EQ(PlaceNewSession(workers, cached, cheap_prefill)->worker, 1);
  PlacementOptions load_only;
  load_only.prefix_balance_sessions = 0;
  load_only.prefix_tokens_per_session = 0;  // a hit is worth nothing
  load_only.prefix_balance_ratio = 0;
  EXPECT_EQ(PlaceNewSession(PlacedLoads({2, 3}), cached, load_only)->worker, 0);
  // Equal loads: the hit still breaks the tie.
  EXPECT_EQ(PlaceNewSession(PlacedLoads({3, 3}), cached, load_only)->worker, 1);
}

TEST(PrefixPlacementTest, AtHighLoadsARatioBoundsTheImbalance) {
  const std::vector<uint32_t> cached = {0, kShortPrefix};
  // 48 <= 1.25 x 40: eight sessions more are a small share.
  EXPECT_EQ(PlaceNewSession(PlacedLoads({40, 48}), cached)->worker, 1);
  // 51 > 50, and 11 sessions more than prefix_balance_sessions + 64 tokens.
  EXPECT_EQ(PlaceNewSession(PlacedLoads({40, 51}), cached)->worker, 0);
}

TEST(PrefixPlacementTest, TheLongestQualifyingHitWinsThenTheLeastLoaded) {
  std::vector<uint32_t> cached = {0, 64, 128, 4096};
  // Worker 3's 4,096 tokens are worth its 5 sessions more.
  EXPECT_EQ(PlaceNewSession(PlacedLoads({0, 1, 1, 5}), cached)->worker, 3);
  // Not 9: of the rest, the longer hit.
  auto p = PlaceNewSession(PlacedLoads({0, 1, 1, 9}), cached);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->worker, 2);
  EXPECT_EQ(p->cached_tokens, 128u);
  // Equal hits: the less loaded holder.
  cached = {0, 64, 64, 0};
  EXPECT_EQ(PlaceNewSession(PlacedLoads({0, 2, 1, 0}), cached)->worker, 2);
  // The least loaded worker's own hit is kept against a longer one that
  // does not qualify.
  cached = {64, 0, 4096};
  p = PlaceNewSession(PlacedLoads({0, 0, 20}), cached);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->worker, 0);
  EXPECT_EQ(p->cached_tokens, 64u);
}

TEST(PrefixPlacementTest, AFullHolderIsPassedOverWhileAnotherHasRoom) {
  std::vector<WorkerLoad> workers = {Load(true, 99, 100),  // full
                                     Load(true, 10, 100)};
  const std::vector<uint32_t> cached = {4096, 0};
  auto p = PlaceNewSession(workers, cached);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->worker, 1);
  EXPECT_EQ(p->cached_tokens, 0u);
  // Every worker full: the holder is no worse than the others.
  workers[1] = Load(true, 98, 100);
  p = PlaceNewSession(workers, cached);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->worker, 0);
  EXPECT_EQ(p->cached_tokens, 4096u);
}

TEST(PrefixPlacementTest, NoHitIsTheUsualPlacement) {
  const std::vector<WorkerLoad> workers = {
      Load(true, 60, 100), Load(true, 20, 100), Load(true, 40, 100)};
  auto p = PlaceNewSession(workers, std::vector<uint32_t>{0, 0, 0});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->worker, PlaceSession(v1::NEW, -1, workers)->worker);
  EXPECT_EQ(p->cached_tokens, 0u);
}

TEST(PrefixPlacementTest, UnavailableHoldersAndBadInputs) {
  std::vector<WorkerLoad> workers = PlacedLoads({3, 3});
  workers[1].available = false;
  auto p = PlaceNewSession(workers, std::vector<uint32_t>{0, 4096});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->worker, 0);
  EXPECT_EQ(p->cached_tokens, 0u);
  EXPECT_EQ(PlaceNewSession(workers, std::vector<uint32_t>{0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  workers[0].available = false;
  EXPECT_EQ(
      PlaceNewSession(workers, std::vector<uint32_t>{64, 64}).status().code(),
      absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace specserve::scheduler
