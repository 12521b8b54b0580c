// Session pool: park → offload → resume continues exactly as never parking
// (greedy and sampled), LRU offload then drop under the two budgets, leases
// are exclusive, and telemetry carries across resumes.
#include "worker/session_pool.h"

#include <atomic>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "worker/model/model.h"
#include "worker/model/test_data.h"
#include "worker/spec/model_executor.h"
#include "worker/spec/spec_engine.h"

namespace specserve::worker {
namespace {

using spec::BurstParams;

class SessionPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = model::Model::Load(
        model::testing::RepoPath("models/specserve-tiny-py"), &backend_);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    executor_ = std::make_unique<spec::ModelExecutor>(model_.get());
    engine_ = std::make_unique<spec::SpecEngine>(executor_.get());
  }

  std::vector<int32_t> Prompt(int seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> p(12);
    for (auto& t : p) t = rng() % model_->config().vocab_size;
    return p;
  }

  std::vector<int32_t> Burst(spec::SpecSession* s, const BurstParams& p) {
    std::vector<int32_t> got;
    auto r = engine_->RunBurst(s, p, [&](absl::Span<const int32_t> t) {
      got.insert(got.end(), t.begin(), t.end());
      return true;
    });
    EXPECT_TRUE(r.ok()) << r.status();
    return got;
  }

  kernels::cpu::CpuBackend backend_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<spec::ModelExecutor> executor_;
  std::unique_ptr<spec::SpecEngine> engine_;
};

TEST_F(SessionPoolTest, ParkOffloadResumeIsExact) {
  for (bool sampled : {false, true}) {
    BurstParams p;
    p.k = 3;
    p.max_new = 9;
    if (sampled) {
      p.sampling = {0.9f, 0, 0.95f, 0.0f};
      p.seed = 77;
    }
    std::vector<std::vector<int32_t>> outputs;
    for (bool park : {false, true}) {
      // A budget of 1 byte offloads every idle session as soon as it is
      // returned to the pool.
      SessionPoolOptions o;
      o.device_budget_bytes = park ? 1 : (1ull << 40);
      o.host_budget_bytes = 1ull << 40;
      SessionPool pool(o, executor_.get());
      auto admitted = engine_->Admit("s", 256, Prompt(1));
      ASSERT_TRUE(admitted.ok());
      std::vector<int32_t> out;
      {
        auto lease = pool.Insert(std::move(*admitted));
        ASSERT_TRUE(lease.ok());
        auto first = Burst(lease->get(), p);
        out.insert(out.end(), first.begin(), first.end());
        if (park) {
          ASSERT_TRUE(engine_->Flush(lease->get()).ok());
        }
      }
      if (park) {
        EXPECT_EQ(pool.stats().offloaded, 1);
        EXPECT_EQ(pool.stats().device_bytes, 0u);
        EXPECT_GT(pool.stats().host_bytes, 0u);
      }
      auto lease = pool.Acquire("s");
      ASSERT_TRUE(lease.ok()) << lease.status();
      auto second = Burst(lease->get(), p);
      out.insert(out.end(), second.begin(), second.end());
      outputs.push_back(out);
    }
    EXPECT_EQ(outputs[0], outputs[1]) << (sampled ? "sampled" : "greedy");
  }
}

TEST_F(SessionPoolTest, LeasesAreExclusiveAndBudgetsEvictLru) {
  SessionPoolOptions o;
  o.device_budget_bytes = 1ull << 40;
  o.host_budget_bytes = 1ull << 40;
  // Measure one session's size, then allow one resident and one offloaded.
  uint64_t one = 0;
  {
    SessionPool probe(o, executor_.get());
    auto s = engine_->Admit("probe", 128, Prompt(2));
    ASSERT_TRUE(s.ok());
    { auto lease = probe.Insert(std::move(*s)); }
    one = probe.stats().device_bytes;
    ASSERT_GT(one, 0u);
  }
  o.device_budget_bytes = one + one / 2;
  SessionPool pool(o, executor_.get());
  for (int i = 0; i < 3; ++i) {
    auto s = engine_->Admit("s" + std::to_string(i), 128, Prompt(10 + i));
    ASSERT_TRUE(s.ok());
    auto lease = pool.Insert(std::move(*s));
    ASSERT_TRUE(lease.ok());
    // A second lease on a busy session is refused.
    EXPECT_EQ(pool.Acquire("s" + std::to_string(i)).status().code(),
              absl::StatusCode::kAborted);
  }
  // s0 and s1 (least recently used) were offloaded; s2 is resident.
  EXPECT_EQ(pool.stats().sessions, 3);
  EXPECT_EQ(pool.stats().offloaded, 2);
  EXPECT_EQ(*pool.ResidencyOf("s2"), Residency::kResident);
  EXPECT_EQ(*pool.ResidencyOf("s0"), Residency::kOffloaded);

  // Over the host budget the oldest offloaded session is dropped and
  // Acquire says it was evicted.
  SessionPoolOptions tight = o;
  const uint64_t snapshot_bytes = pool.stats().host_bytes / 2;
  tight.host_budget_bytes = snapshot_bytes + snapshot_bytes / 2;
  SessionPool small(tight, executor_.get());
  for (int i = 0; i < 3; ++i) {
    auto s = engine_->Admit("t" + std::to_string(i), 128, Prompt(20 + i));
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(small.Insert(std::move(*s)).ok());
  }
  EXPECT_EQ(small.stats().drops, 1u);
  auto gone = small.Acquire("t0");
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(gone.status().message().find("evicted"), std::string::npos);
  // Only its owner learns that it was evicted.
  EXPECT_EQ(small.Acquire("t0", "own_other").status().message(),
            "session t0 is not on this worker");
  EXPECT_TRUE(small.Acquire("t1").ok());  // restored from host memory
}

TEST_F(SessionPoolTest, AnotherOwnerReadsAsUnknownAndChangesNothing) {
  SessionPoolOptions o;
  SessionPool pool(o, executor_.get());
  auto s = engine_->Admit("o", 128, Prompt(9));
  ASSERT_TRUE(s.ok());
  {
    auto lease = pool.Insert(std::move(*s), "own_a");
    ASSERT_TRUE(lease.ok());
  }
  const std::string unknown(pool.Acquire("nope", "own_a").status().message());
  EXPECT_EQ(unknown, "session nope is not on this worker");
  for (const char* owner : {"", "own_b", "own_", "own_aa"}) {
    auto got = pool.Acquire("o", owner);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound) << owner;
    EXPECT_EQ(got.status().message(), "session o is not on this worker");
    absl::Status released = pool.Release("o", owner);
    EXPECT_EQ(released.code(), absl::StatusCode::kNotFound) << owner;
    EXPECT_EQ(released.message(), "session o is not on this worker");
  }
  EXPECT_EQ(pool.stats().sessions, 1);
  SessionPool::Listing l = pool.List();
  ASSERT_EQ(l.sessions.size(), 1u);
  EXPECT_EQ(l.sessions[0].owner, "own_a");
  {
    auto mine = pool.Acquire("o", "own_a");
    ASSERT_TRUE(mine.ok()) << mine.status();
    EXPECT_EQ((*mine)->committed_len(), 12);
  }
  EXPECT_TRUE(pool.Release("o", "own_a").ok());
  EXPECT_EQ(pool.stats().sessions, 0);
}

TEST_F(SessionPoolTest, ResumedSessionCarriesTelemetry) {
  SessionPoolOptions o;
  SessionPool pool(o, executor_.get());
  auto s = engine_->Admit("tel", 256, Prompt(3));
  ASSERT_TRUE(s.ok());
  BurstParams p;
  p.k = 2;
  p.max_new = 8;
  uint64_t rounds_before;
  {
    auto lease = pool.Insert(std::move(*s));
    Burst(lease->get(), p);
    rounds_before = (*lease)->telem.rounds;
    ASSERT_GT(rounds_before, 0u);
  }
  auto lease = pool.Acquire("tel");
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ((*lease)->telem.rounds, rounds_before);
  const telemetry::SpecTelemetry snapshot = (*lease)->telem;
  Burst(lease->get(), p);
  EXPECT_GT((*lease)->telem.DeltaSince(snapshot).rounds, 0u);
}

TEST_F(SessionPoolTest, ReleaseWhileLeasedDetachesAndFreesOnReturn) {
  // The scheduler releases a session whose burst it gave up on (client
  // cancel, deadline) while the worker's burst thread may still hold it.
  SessionPoolOptions o;
  SessionPool pool(o, executor_.get());
  auto s = engine_->Admit("r", 128, Prompt(4));
  ASSERT_TRUE(s.ok());
  {
    auto lease = pool.Insert(std::move(*s));
    ASSERT_TRUE(lease.ok());
    EXPECT_TRUE(pool.Release("r").ok());
    // Still counted (its memory is in use) but the id is free at once.
    EXPECT_EQ(pool.stats().sessions, 1);
    EXPECT_EQ(pool.Acquire("r").status().code(), absl::StatusCode::kNotFound);
    auto again = engine_->Admit("r", 128, Prompt(5));
    ASSERT_TRUE(again.ok());
    {
      auto fresh = pool.Insert(std::move(*again));
      ASSERT_TRUE(fresh.ok());
    }
    EXPECT_EQ(pool.stats().sessions, 2);
  }
  // The old lease returned: the detached copy is freed, the new one stays.
  EXPECT_EQ(pool.stats().sessions, 1);
  EXPECT_TRUE(pool.Acquire("r").ok());
}

TEST_F(SessionPoolTest, ListingEpochAndReleaseIdle) {
  // The epoch moves only when the pool changes an idle session on its own
  // (offload, drop, ReleaseIdle), so a scheduler re-reads the list only then.
  SessionPoolOptions o;
  o.device_budget_bytes = 0;  // every idle session is offloaded
  SessionPool pool(o, executor_.get());
  EXPECT_EQ(pool.epoch(), 0u);
  auto a = engine_->Admit("a", 128, Prompt(6));
  auto b = engine_->Admit("b", 128, Prompt(7));
  ASSERT_TRUE(a.ok() && b.ok());
  {
    auto lease = pool.Insert(std::move(*a));
    ASSERT_TRUE(lease.ok());
  }
  const uint64_t after_offload = pool.epoch();
  EXPECT_EQ(after_offload, 1u);  // "a" went to host memory
  auto busy = pool.Insert(std::move(*b));
  ASSERT_TRUE(busy.ok());
  SessionPool::Listing l = pool.List();
  EXPECT_EQ(l.epoch, after_offload);
  ASSERT_EQ(l.sessions.size(), 2u);
  EXPECT_EQ(l.sessions[0].id, "a");
  EXPECT_FALSE(l.sessions[0].busy);
  EXPECT_EQ(l.sessions[0].residency, Residency::kOffloaded);
  EXPECT_EQ(l.sessions[1].id, "b");
  EXPECT_TRUE(l.sessions[1].busy);
  // A release the caller asked for leaves the epoch alone.
  EXPECT_TRUE(pool.Release("a").ok());
  EXPECT_EQ(pool.epoch(), after_offload);
  // ReleaseIdle frees idle sessions only; the leased one stays.
  auto c = engine_->Admit("c", 128, Prompt(8));
  ASSERT_TRUE(c.ok());
  {
    auto lease = pool.Insert(std::move(*c));
    ASSERT_TRUE(lease.ok());
  }
  const uint64_t before = pool.epoch();
  EXPECT_EQ(pool.ReleaseIdle(), 1);
  EXPECT_GT(pool.epoch(), before);
  EXPECT_EQ(pool.stats().sessions, 1);
  EXPECT_EQ(pool.Acquire("c").status().code(), absl::StatusCode::kNotFound);
  const uint64_t settled = pool.epoch();
  EXPECT_EQ(pool.ReleaseIdle(), 0);  // nothing idle: no change to report
  EXPECT_EQ(pool.epoch(), settled);
}

// A CPU backend that counts the bytes it has allocated and not yet freed:
// the device memory a session really holds, whatever the pool reports.
class CountingCpuBackend : public kernels::cpu::CpuBackend {
 public:
  absl::StatusOr<kernels::Buffer> Allocate(size_t bytes) override {
    absl::StatusOr<kernels::Buffer> b = CpuBackend::Allocate(bytes);
    if (b.ok()) {
      absl::MutexLock lock(&mu_);
      sizes_[b->data()] = bytes;
      live_ += bytes;
    }
    return b;
  }
  uint64_t live_bytes() const {
    absl::MutexLock lock(&mu_);
    return live_;
  }

 protected:
  void Free(void* data) override {
    {
      absl::MutexLock lock(&mu_);
      auto it = sizes_.find(data);
      if (it != sizes_.end()) {
        live_ -= it->second;
        sizes_.erase(it);
      }
    }
    CpuBackend::Free(data);
  }

 private:
  mutable absl::Mutex mu_;
  std::map<void*, size_t> sizes_ ABSL_GUARDED_BY(mu_);
  uint64_t live_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(SessionPoolMemoryTest, OffloadMovesTheCheckpointToHostMemory) {
  CountingCpuBackend backend;
  auto m = model::Model::Load(
      model::testing::RepoPath("models/specserve-tiny-py"), &backend);
  ASSERT_TRUE(m.ok()) << m.status();
  spec::ModelExecutor executor(m->get());
  spec::SpecEngine engine(&executor);
  std::mt19937 rng(9);
  std::vector<int32_t> prompt(12);
  for (auto& t : prompt) t = rng() % (*m)->config().vocab_size;
  BurstParams first;
  first.k = 3;
  first.max_new = 9;
  BurstParams rewind = first;
  rewind.rewind = true;
  rewind.suffix = {prompt[3], prompt[5]};
  auto run = [&](spec::SpecSession* s, const BurstParams& p) {
    std::vector<int32_t> got;
    auto r = engine.RunBurst(s, p, [&](absl::Span<const int32_t> t) {
      got.insert(got.end(), t.begin(), t.end());
      return true;
    });
    EXPECT_TRUE(r.ok()) << r.status();
    return got;
  };

  // [first burst, park, rewind burst] in a pool that offloads every idle
  // session (budget 1 byte) and in one that never does.
  std::vector<std::vector<int32_t>> outputs;
  for (bool offload : {false, true}) {
    SessionPoolOptions o;
    o.device_budget_bytes = offload ? 1 : (1ull << 40);
    o.host_budget_bytes = 1ull << 40;
    SessionPool pool(o, &executor);
    // Lazily made buffers (workspace, sampling rows) exist before `idle`.
    const uint64_t idle = backend.live_bytes();
    auto admitted = engine.Admit("s", 256, prompt);
    ASSERT_TRUE(admitted.ok()) << admitted.status();
    std::vector<int32_t> out;
    uint64_t checkpoint_bytes = 0;
    {
      auto lease = pool.Insert(std::move(*admitted));
      ASSERT_TRUE(lease.ok());
      out = run(lease->get(), first);
      ASSERT_TRUE(engine.Flush(lease->get()).ok());
      ASSERT_NE((*lease)->checkpoint(), nullptr);
      checkpoint_bytes = (*lease)->checkpoint()->trunk->bytes();
      ASSERT_GT(checkpoint_bytes, 0u);
    }
    if (offload) {
      const SessionPool::Stats st = pool.stats();
      EXPECT_EQ(st.offloaded, 1);
      // The pool's figure and the backend agree: the session, checkpoint
      // included, holds no device memory while offloaded.
      EXPECT_EQ(st.device_bytes, 0u);
      EXPECT_EQ(backend.live_bytes(), idle);
      EXPECT_GT(st.host_bytes, checkpoint_bytes);
    }
    auto lease = pool.Acquire("s");
    ASSERT_TRUE(lease.ok()) << lease.status();
    if (offload) {
      EXPECT_EQ(pool.stats().device_bytes, backend.live_bytes() - idle);
    }
    auto again = run(lease->get(), rewind);
    out.insert(out.end(), again.begin(), again.end());
    outputs.push_back(out);
  }
  // The checkpoint came back bit-identical: the rewind continues exactly.
  EXPECT_EQ(outputs[0], outputs[1]);
}

TEST_F(SessionPoolTest, ReadersShareTheSourceAndLeaveThePoolFree) {
  // Many requests fork one parked source at once (automatic prefix reuse):
  // they read it together, the pool serves every other session meanwhile,
  // and a lease or release of the source waits for the readers.
  SessionPoolOptions o;
  o.device_budget_bytes = 0;  // every idle session is offloaded...
  SessionPool pool(o, executor_.get());
  for (const char* id : {"src", "other"}) {
    auto s = engine_->Admit(id, 128, Prompt(8));
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(pool.Insert(std::move(*s)).ok());
  }
  absl::Notification inside, go;
  std::thread reader([&] {
    EXPECT_TRUE(pool.WithIdle("src", "",
                              [&](const spec::SpecSession& s) {
                                inside.Notify();
                                go.WaitForNotification();
                                return absl::OkStatus();
                              })
                    .ok());
  });
  inside.WaitForNotification();
  // ...but not one being read: it was restored for the reader and stays.
  EXPECT_EQ(pool.ResidencyOf("src").value(), Residency::kResident);
  int second = 0;
  EXPECT_TRUE(pool.WithIdle("src", "",
                            [&](const spec::SpecSession& s) {
                              ++second;
                              return absl::OkStatus();
                            })
                  .ok());
  EXPECT_EQ(second, 1);
  EXPECT_TRUE(pool.Acquire("other").ok());
  EXPECT_EQ(pool.ReleaseIdle(), 1);  // "other"; "src" is being read
  std::atomic<bool> leased{false};
  std::thread acquirer([&] {
    auto lease = pool.Acquire("src");
    EXPECT_TRUE(lease.ok()) << lease.status();
    leased = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(leased);  // waits for the reader
  go.Notify();
  reader.join();
  acquirer.join();
  EXPECT_TRUE(leased);
  EXPECT_TRUE(pool.Release("src").ok());
  EXPECT_EQ(pool.stats().sessions, 0);
}

}  // namespace
}  // namespace specserve::worker
