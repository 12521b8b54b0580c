#include "scheduler/session_table.h"

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specserve::scheduler {
namespace {

namespace v1 = specserve::v1;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

class SessionTableTest : public ::testing::Test {
 protected:
  SessionTableOptions Options() {
    SessionTableOptions o;
    o.max_sessions = 4;
    o.default_capacity = 100;
    o.max_capacity = 1000;
    o.now = [this] { return now_; };
    return o;
  }
  absl::Time now_ = absl::UnixEpoch() + absl::Hours(1);
};

TEST(SessionIdTest, FormatAndUniqueness) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    absl::StatusOr<std::string> id = NewSessionId();
    ASSERT_TRUE(id.ok());
    ASSERT_EQ(id->size(), 4u + 32u);
    EXPECT_TRUE(absl::StartsWith(*id, "ses_"));
    for (char c : id->substr(4)) {
      EXPECT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) << *id;
    }
    EXPECT_TRUE(seen.insert(*id).second) << "duplicate id " << *id;
  }
}

TEST_F(SessionTableTest, OpenGetList) {
  SessionTable table(Options());
  auto a = table.Open(0, "");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->residency, v1::NEW);
  EXPECT_EQ(a->capacity, 100u);  // default
  EXPECT_EQ(a->worker, -1);
  EXPECT_FALSE(a->busy);
  now_ += absl::Seconds(1);
  auto b = table.Open(500, "");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->capacity, 500u);

  auto got = table.Get(a->id, "");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->id, a->id);
  std::vector<SessionSnapshot> list = table.List("");
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].id, a->id);  // oldest first
  EXPECT_EQ(list[1].id, b->id);
  EXPECT_EQ(table.size(), 2u);
}

// Whoever sees the session last frees its worker copy: a close while a
// request holds the lease reports was_busy (the request frees it) and the
// lease's release then reports the close; a close after the release finds
// it idle (the close frees it) and the release reported nothing.
TEST_F(SessionTableTest, ReleaseSeesACloseThatCameWhileBusy) {
  SessionTable table(Options());
  auto a = table.Open(0, "");
  ASSERT_TRUE(a.ok());
  auto lease = table.Acquire(a->id, "");
  ASSERT_TRUE(lease.ok());
  auto closed = table.Close(a->id, "");
  ASSERT_TRUE(closed.ok());
  EXPECT_TRUE(closed->was_busy);
  EXPECT_TRUE(lease->ReleaseSeeingClose());

  auto b = table.Open(0, "");
  ASSERT_TRUE(b.ok());
  auto second = table.Acquire(b->id, "");
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->ReleaseSeeingClose());
  closed = table.Close(b->id, "");
  ASSERT_TRUE(closed.ok());
  EXPECT_FALSE(closed->was_busy);
}

TEST_F(SessionTableTest, CapacityBoundsAndSessionCap) {
  SessionTable table(Options());
  auto big = table.Open(1001, "");
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(big.status().message()),
              HasSubstr("capacity 1001 exceeds the model context (1000)"));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(table.Open(0, "").ok());
  auto full = table.Open(0, "");
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.status().message()),
              HasSubstr("session limit reached (4 open)"));
  EXPECT_EQ(table.OpenAndAcquire(0, "").status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(SessionTableTest, UnknownAndOtherTenantsReadAsNotFound) {
  SessionTable table(Options());
  auto mine = table.Open(0, "alice");
  ASSERT_TRUE(mine.ok());
  auto unknown = table.Get("ses_00000000000000000000000000000000", "alice");
  auto other = table.Get(mine->id, "bob");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(other.status().message(),
            absl::StrCat("session ", mine->id, " not found"));
  EXPECT_EQ(table.Acquire(mine->id, "bob").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(table.Close(mine->id, "bob").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(table.List("bob").empty());
  EXPECT_EQ(table.List("alice").size(), 1u);
  EXPECT_TRUE(table.Get(mine->id, "alice").ok());
}

TEST_F(SessionTableTest, AnotherTenantLeavesTheSessionUnchanged) {
  SessionTable table(Options());
  auto lease = table.OpenAndAcquire(100, "alice");
  ASSERT_TRUE(lease.ok());
  const std::string id = lease->id();
  ASSERT_TRUE(lease->AppendCommitted({1, 2, 3, 4}).ok());
  ASSERT_TRUE(lease->SetRewindPos(3).ok());
  lease->SetResidency(v1::PARKED, v1::SPECULATIVE, 0);
  const std::string unknown_message =
      std::string(table.Get("ses_ffffffffffffffffffffffffffffffff", "bob")
                      .status()
                      .message());
  // While alice's turn runs, bob's lease reads NOT_FOUND, not ABORTED
  // ("already has a request in flight" would confirm the id exists).
  auto busy = table.Acquire(id, "bob");
  EXPECT_EQ(busy.status().code(), absl::StatusCode::kNotFound);
  lease->Release();

  // Every look-up of bob's answers as for an unknown id, and changes
  // nothing.
  for (const absl::Status& s :
       {table.Get(id, "bob").status(), table.Acquire(id, "bob").status(),
        table.Close(id, "bob").status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(s.message(), absl::StrCat("session ", id, " not found"));
  }
  EXPECT_EQ(unknown_message,
            "session ses_ffffffffffffffffffffffffffffffff not found");
  // Without authentication every caller is the tenant "": not alice.
  EXPECT_EQ(table.Get(id, "").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(table.List("bob").empty());
  EXPECT_TRUE(table.List("").empty());

  auto mine = table.Get(id, "alice");
  ASSERT_TRUE(mine.ok());
  EXPECT_EQ(mine->tenant, "alice");
  EXPECT_EQ(mine->committed_len, 4u);
  EXPECT_EQ(mine->rewind_pos, 3u);
  EXPECT_EQ(mine->residency, v1::PARKED);
  EXPECT_FALSE(mine->busy);
  auto again = table.Acquire(id, "alice");
  ASSERT_TRUE(again.ok());
  EXPECT_THAT(again->History(), ElementsAre(1, 2, 3, 4));
  again->Release();
  ASSERT_EQ(table.List("alice").size(), 1u);
  EXPECT_TRUE(table.Close(id, "alice").ok());
}

TEST_F(SessionTableTest, OneLeaseAtATime) {
  SessionTable table(Options());
  auto s = table.Open(0, "");
  ASSERT_TRUE(s.ok());
  {
    auto lease = table.Acquire(s->id, "");
    ASSERT_TRUE(lease.ok());
    EXPECT_TRUE(table.Get(s->id, "")->busy);
    auto second = table.Acquire(s->id, "");
    EXPECT_EQ(second.status().code(), absl::StatusCode::kAborted);
    EXPECT_EQ(
        second.status().message(),
        absl::StrCat("session ", s->id, " already has a request in flight"));
  }
  EXPECT_FALSE(table.Get(s->id, "")->busy);
  EXPECT_TRUE(table.Acquire(s->id, "").ok());
}

TEST_F(SessionTableTest, LeaseMoveAndRelease) {
  SessionTable table(Options());
  auto s = table.Open(0, "");
  ASSERT_TRUE(s.ok());
  SessionLease held;
  EXPECT_FALSE(held.valid());
  {
    auto lease = table.Acquire(s->id, "");
    ASSERT_TRUE(lease.ok());
    held = std::move(*lease);
  }
  EXPECT_TRUE(table.Get(s->id, "")->busy);
  SessionLease moved(std::move(held));
  EXPECT_EQ(moved.id(), s->id);
  moved.Release();
  EXPECT_FALSE(moved.valid());
  EXPECT_FALSE(table.Get(s->id, "")->busy);
}

TEST_F(SessionTableTest, TurnUpdatesHistoryResidencyTelemetryGate) {
  SessionTable table(Options());
  auto lease = table.OpenAndAcquire(10, "");
  ASSERT_TRUE(lease.ok());
  const std::string id = lease->id();
  EXPECT_TRUE(table.Get(id, "")->busy);

  ASSERT_TRUE(lease->AppendCommitted({1, 2, 3, 4}).ok());
  ASSERT_TRUE(lease->SetRewindPos(3).ok());
  ASSERT_TRUE(lease->AppendCommitted({5, 6}).ok());
  lease->SetResidency(v1::ACTIVE, v1::SPECULATIVE, 1);
  v1::SessionTelemetry delta;
  delta.set_rounds(2);
  delta.set_drafted(6);
  delta.set_accepted(4);
  delta.add_drafted_per_position(2);
  delta.add_accepted_per_position(2);
  lease->AddTelemetry(delta);
  lease->AddTelemetry(delta);
  SpecGateDecision gate;
  gate.mode = v1::SPECULATIVE;
  gate.reason = "speculation pays";
  gate.next_state.below_count = 1;
  lease->SetGateDecision(gate);

  EXPECT_THAT(lease->History(), ElementsAre(1, 2, 3, 4, 5, 6));
  // Past capacity: refused, nothing appended.
  absl::Status over = lease->AppendCommitted({7, 8, 9, 10, 11});
  EXPECT_EQ(over.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(lease->Snapshot().committed_len, 6u);
  EXPECT_EQ(lease->SetRewindPos(7).code(), absl::StatusCode::kOutOfRange);

  SessionSnapshot snap = lease->Snapshot();
  EXPECT_EQ(snap.residency, v1::ACTIVE);
  EXPECT_EQ(snap.mode, v1::SPECULATIVE);
  EXPECT_EQ(snap.worker, 1);
  EXPECT_EQ(snap.rewind_pos, 3u);
  EXPECT_EQ(snap.telemetry.rounds, 4u);
  EXPECT_EQ(snap.telemetry.accepted, 8u);
  EXPECT_THAT(snap.telemetry.accepted_per_position, ElementsAre(4));
  EXPECT_EQ(snap.gate_state.below_count, 1u);
  EXPECT_EQ(snap.last_gate_decision.reason(), "speculation pays");

  const std::vector<std::string> addresses = {"127.0.0.1:1", "127.0.0.1:2"};
  v1::SessionInfo info = snap.ToProto(addresses);
  EXPECT_EQ(info.session_id(), id);
  EXPECT_EQ(info.residency(), v1::ACTIVE);
  EXPECT_EQ(info.mode(), v1::SPECULATIVE);
  EXPECT_EQ(info.worker(), "127.0.0.1:2");
  EXPECT_EQ(info.committed_tokens(), 6u);
  EXPECT_EQ(info.capacity(), 10u);
  ASSERT_TRUE(info.has_rewind_pos());
  EXPECT_EQ(info.rewind_pos(), 3u);
  EXPECT_EQ(info.telemetry().drafted(), 12u);
  EXPECT_EQ(info.last_gate_decision().mode(), v1::SPECULATIVE);
  EXPECT_TRUE(info.busy());

  // REWIND: back to the checkpoint.
  ASSERT_TRUE(lease->TruncateTo(3).ok());
  EXPECT_THAT(lease->History(), ElementsAre(1, 2, 3));
  EXPECT_EQ(lease->Snapshot().rewind_pos, 3u);
  ASSERT_TRUE(lease->TruncateTo(2).ok());
  EXPECT_FALSE(lease->Snapshot().rewind_pos.has_value());  // past it: dropped
  EXPECT_EQ(lease->TruncateTo(5).code(), absl::StatusCode::kOutOfRange);
}

TEST_F(SessionTableTest, NoWorkerMeansEmptyAddress) {
  SessionTable table(Options());
  auto s = table.Open(0, "");
  ASSERT_TRUE(s.ok());
  v1::SessionInfo info = s->ToProto({"a:1"});
  EXPECT_EQ(info.worker(), "");
  EXPECT_FALSE(info.has_rewind_pos());
  EXPECT_EQ(info.residency(), v1::NEW);
}

TEST_F(SessionTableTest, CloseIdleAndBusySessions) {
  SessionTable table(Options());
  auto idle = table.Open(0, "");
  ASSERT_TRUE(idle.ok());
  {
    auto lease = table.Acquire(idle->id, "");
    lease->SetResidency(v1::PARKED, v1::BATCHED, 0);
  }
  auto closed = table.Close(idle->id, "");
  ASSERT_TRUE(closed.ok());
  EXPECT_FALSE(closed->was_busy);
  EXPECT_EQ(closed->worker, 0);
  EXPECT_EQ(closed->residency, v1::PARKED);
  EXPECT_EQ(table.Get(idle->id, "").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(table.Close(idle->id, "").status().code(),
            absl::StatusCode::kNotFound);

  auto busy = table.OpenAndAcquire(0, "");
  ASSERT_TRUE(busy.ok());
  busy->SetResidency(v1::ACTIVE, v1::SPECULATIVE, 1);
  EXPECT_FALSE(busy->closed());
  auto closed_busy = table.Close(busy->id(), "");
  ASSERT_TRUE(closed_busy.ok());
  EXPECT_TRUE(closed_busy->was_busy);
  EXPECT_EQ(closed_busy->worker, 1);
  // The lease still works, and says the session is gone.
  EXPECT_TRUE(busy->closed());
  EXPECT_TRUE(busy->AppendCommitted({1}).ok());
  EXPECT_EQ(busy->Snapshot().residency, v1::CLOSED);
  busy->Release();
  EXPECT_EQ(table.size(), 0u);
}

TEST_F(SessionTableTest, MarkWorkerLostKeepsHistory) {
  SessionTable table(Options());
  std::vector<std::string> ids;
  const v1::Residency residencies[] = {v1::ACTIVE, v1::PARKED, v1::OFFLOADED};
  for (v1::Residency r : residencies) {
    auto lease = table.OpenAndAcquire(0, "");
    ASSERT_TRUE(lease.ok());
    ASSERT_TRUE(lease->AppendCommitted({7, 8, 9}).ok());
    lease->SetResidency(r, v1::BATCHED, 0);
    ids.push_back(lease->id());
  }
  auto elsewhere = table.OpenAndAcquire(0, "");
  ASSERT_TRUE(elsewhere.ok());
  elsewhere->SetResidency(v1::PARKED, v1::BATCHED, 1);
  const std::string other = elsewhere->id();
  elsewhere->Release();

  EXPECT_EQ(table.CountOnWorker(0, v1::ACTIVE), 1);
  std::vector<std::string> lost = table.MarkWorkerLost(0);
  EXPECT_THAT(lost, UnorderedElementsAre(ids[0], ids[1], ids[2]));
  for (const std::string& id : ids) {
    auto s = table.Get(id, "");
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->residency, v1::LOST);
    EXPECT_EQ(s->worker, -1);
    EXPECT_EQ(s->committed_len, 3u);
    auto lease = table.Acquire(id, "");
    ASSERT_TRUE(lease.ok());
    EXPECT_THAT(lease->History(), ElementsAre(7, 8, 9));
  }
  EXPECT_EQ(table.Get(other, "")->residency, v1::PARKED);
  std::map<v1::Residency, int> counts = table.CountByResidency();
  EXPECT_EQ(counts[v1::LOST], 3);
  EXPECT_EQ(counts[v1::PARKED], 1);
  EXPECT_TRUE(table.MarkWorkerLost(0).empty());  // idempotent
}

TEST_F(SessionTableTest, MarkWorkerLostLeavesBusyAndNewerSessions) {
  SessionTable table(Options());
  auto parked = table.OpenAndAcquire(0, "");
  ASSERT_TRUE(parked.ok());
  parked->SetResidency(v1::PARKED, v1::SPECULATIVE, 0);
  const std::string parked_id = parked->id();
  parked->Release();
  // A request runs on the worker: its own failure handling marks it.
  auto busy = table.OpenAndAcquire(0, "");
  ASSERT_TRUE(busy.ok());
  busy->SetResidency(v1::ACTIVE, v1::SPECULATIVE, 0);
  const absl::Time as_of = now_ + absl::Seconds(1);
  // Parked after the poll that found the worker gone was sent: the worker
  // answered that Park, so the poll does not speak for it.
  now_ += absl::Seconds(2);
  auto newer = table.OpenAndAcquire(0, "");
  ASSERT_TRUE(newer.ok());
  newer->SetResidency(v1::PARKED, v1::SPECULATIVE, 0);
  const std::string newer_id = newer->id();
  newer->Release();

  EXPECT_THAT(table.MarkWorkerLost(0, as_of), ElementsAre(parked_id));
  EXPECT_EQ(table.Get(parked_id, "")->residency, v1::LOST);
  EXPECT_EQ(busy->Snapshot().residency, v1::ACTIVE);
  EXPECT_EQ(busy->Snapshot().worker, 0);
  EXPECT_EQ(table.Get(newer_id, "")->residency, v1::PARKED);
  // A later poll (the worker still gone) covers it.
  EXPECT_THAT(table.MarkWorkerLost(0, now_ + absl::Seconds(1)),
              ElementsAre(newer_id));
}

TEST_F(SessionTableTest, ReconcileWorkerFollowsTheWorkersList) {
  SessionTable table(Options());
  auto place = [&](v1::Residency r, int worker) {
    auto lease = table.OpenAndAcquire(0, "");
    EXPECT_TRUE(lease.ok());
    lease->SetResidency(r, v1::SPECULATIVE, worker);
    return lease->id();  // the lease ends here: idle
  };
  const std::string offloaded = place(v1::PARKED, 0);   // the pool offloaded it
  const std::string dropped = place(v1::OFFLOADED, 0);  // the pool dropped it
  const std::string moved = place(v1::PARKED, 1);  // its copy on 0 is stale
  auto busy = table.OpenAndAcquire(0, "");         // being admitted on worker 0
  ASSERT_TRUE(busy.ok());
  busy->SetResidency(v1::LOST, v1::SPECULATIVE, -1);
  const absl::Time as_of = now_ + absl::Seconds(1);
  now_ += absl::Seconds(2);

  std::vector<SessionTable::WorkerCopy> copies = {
      {offloaded, v1::OFFLOADED},
      {moved, v1::PARKED},
      {busy->id(), v1::ACTIVE},
      {"ses_of_another_scheduler", v1::PARKED},
  };
  SessionTable::Reconciled r = table.ReconcileWorker(0, copies, as_of);
  EXPECT_THAT(r.lost, ElementsAre(dropped));
  // Another scheduler's session (the worker may serve several) is not ours
  // to release; our stale copy of a moved session is.
  EXPECT_THAT(r.abandoned, ElementsAre(moved));
  EXPECT_EQ(table.Get(offloaded, "")->residency, v1::OFFLOADED);
  EXPECT_EQ(table.Get(offloaded, "")->worker, 0);
  EXPECT_EQ(table.Get(dropped, "")->residency, v1::LOST);
  EXPECT_EQ(table.Get(dropped, "")->worker, -1);
  EXPECT_EQ(table.Get(moved, "")->residency, v1::PARKED);
  EXPECT_EQ(table.Get(moved, "")->worker, 1);
  EXPECT_EQ(busy->Snapshot().residency, v1::LOST);  // its request decides
  std::map<v1::Residency, int> counts = table.CountByResidency();
  EXPECT_EQ(counts[v1::LOST], 2);
  EXPECT_EQ(counts[v1::OFFLOADED], 1);

  // A list taken before a session's last change says nothing about it: a
  // restarted worker's list lacks a session parked there after the ask.
  const absl::Time second_ask = now_ + absl::Seconds(1);
  now_ += absl::Seconds(2);
  busy->SetResidency(v1::PARKED, v1::SPECULATIVE, 0);
  busy->Release();
  r = table.ReconcileWorker(0, {}, second_ask);
  EXPECT_THAT(r.lost, ElementsAre(offloaded));
  EXPECT_TRUE(r.abandoned.empty());
  EXPECT_EQ(table.CountOnWorker(0, v1::PARKED), 1);
}

TEST_F(SessionTableTest, ExpireIdleSkipsBusyAndRecent) {
  SessionTable table(Options());
  auto old_idle = table.Open(0, "");
  auto old_busy = table.Open(0, "");
  ASSERT_TRUE(old_idle.ok() && old_busy.ok());
  {
    auto lease = table.Acquire(old_idle->id, "");
    lease->SetResidency(v1::PARKED, v1::SPECULATIVE, 2);
  }
  auto busy_lease = table.Acquire(old_busy->id, "");
  ASSERT_TRUE(busy_lease.ok());
  now_ += absl::Minutes(10);
  auto recent = table.Open(0, "");
  ASSERT_TRUE(recent.ok());

  std::vector<SessionTable::Expired> expired =
      table.ExpireIdle(absl::Minutes(5));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].id, old_idle->id);
  EXPECT_EQ(expired[0].worker, 2);
  EXPECT_EQ(expired[0].residency, v1::PARKED);
  EXPECT_EQ(table.size(), 2u);
  EXPECT_TRUE(table.Get(old_busy->id, "").ok());
  // Releasing the lease refreshes last_used.
  busy_lease->Release();
  EXPECT_TRUE(table.ExpireIdle(absl::Minutes(5)).empty());
}

TEST_F(SessionTableTest, ConcurrentAcquireGrantsOneLease) {
  SessionTable table(Options());
  auto s = table.Open(0, "");
  ASSERT_TRUE(s.ok());
  std::atomic<int> holders{0};
  std::atomic<int> max_holders{0};
  std::atomic<int> aborted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 300; ++i) {
        auto lease = table.Acquire(s->id, "");
        if (!lease.ok()) {
          EXPECT_EQ(lease.status().code(), absl::StatusCode::kAborted);
          ++aborted;
          continue;
        }
        const int now = ++holders;
        int prev = max_holders.load();
        while (now > prev && !max_holders.compare_exchange_weak(prev, now)) {
        }
        lease->SetResidency(v1::ACTIVE, v1::BATCHED, 0);
        EXPECT_TRUE(table.Get(s->id, "").ok());
        --holders;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(max_holders.load(), 1);
  EXPECT_FALSE(table.Get(s->id, "")->busy);
}

}  // namespace
}  // namespace specserve::scheduler
