#include "scheduler/admission.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specserve::scheduler {
namespace {

using ::testing::HasSubstr;

AdmissionOptions Options(int running, int queued) {
  AdmissionOptions o;
  o.max_running = running;
  o.max_queued = queued;
  return o;
}

const absl::Time kNoDeadline = absl::InfiniteFuture();

TEST(AdmissionTest, RunsThenQueuesThenRefuses) {
  AdmissionController ac(Options(2, 1));
  auto a = ac.TryAdmit();
  auto b = ac.TryAdmit();
  auto c = ac.TryAdmit();
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_TRUE(a->running());
  EXPECT_TRUE(b->running());
  EXPECT_FALSE(c->running());
  EXPECT_EQ(ac.running(), 2);
  EXPECT_EQ(ac.queued(), 1);

  auto d = ac.TryAdmit();
  EXPECT_EQ(d.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(d.status().message()),
              HasSubstr("server busy: 2 requests running, 1 queued; retry "
                        "after ~"));
  EXPECT_THAT(std::string(d.status().message()), HasSubstr(" ms"));
}

TEST(AdmissionTest, ReleasePromotesQueueHeadInFifoOrder) {
  AdmissionController ac(Options(1, 3));
  auto a = ac.TryAdmit();
  auto b = ac.TryAdmit();
  auto c = ac.TryAdmit();
  auto d = ac.TryAdmit();
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && d.ok());
  EXPECT_FALSE(b->running());
  a->Release();
  EXPECT_TRUE(b->running());  // promoted eagerly, before anyone waits
  EXPECT_FALSE(c->running());
  EXPECT_FALSE(d->running());
  // Leaving the queue does not disturb the order of the others.
  c->Release();
  b->Release();
  EXPECT_TRUE(d->running());
  EXPECT_EQ(ac.running(), 1);
  EXPECT_EQ(ac.queued(), 0);
  EXPECT_TRUE(d->Wait(kNoDeadline, nullptr).ok());
}

TEST(AdmissionTest, DestructorReleases) {
  AdmissionController ac(Options(1, 1));
  {
    auto a = ac.TryAdmit();
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(ac.running(), 1);
  }
  EXPECT_EQ(ac.running(), 0);
  auto b = ac.TryAdmit();
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(b->running());
}

TEST(AdmissionTest, MoveTransfersOwnership) {
  AdmissionController ac(Options(1, 0));
  AdmissionTicket held;
  EXPECT_FALSE(held.valid());
  {
    auto a = ac.TryAdmit();
    ASSERT_TRUE(a.ok());
    held = std::move(*a);
  }
  EXPECT_TRUE(held.valid());
  EXPECT_EQ(ac.running(), 1);
  AdmissionTicket other(std::move(held));
  EXPECT_FALSE(held.valid());
  EXPECT_TRUE(other.running());
  other = AdmissionTicket();
  EXPECT_EQ(ac.running(), 0);
}

TEST(AdmissionTest, WaitReturnsWhenAnotherThreadReleases) {
  AdmissionController ac(Options(1, 1));
  auto a = ac.TryAdmit();
  auto b = ac.TryAdmit();
  ASSERT_TRUE(a.ok() && b.ok());
  std::thread releaser([&] { a->Release(); });
  EXPECT_TRUE(b->Wait(kNoDeadline, [] { return false; }).ok());
  EXPECT_TRUE(b->running());
  releaser.join();
}

TEST(AdmissionTest, WaitPastDeadline) {
  AdmissionController ac(Options(1, 2));
  auto a = ac.TryAdmit();
  auto b = ac.TryAdmit();
  auto c = ac.TryAdmit();
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  absl::Status s = c->Wait(absl::Now() - absl::Seconds(1), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), HasSubstr("position 2 of 2"));
  EXPECT_EQ(ac.queued(), 2);  // still queued until released
  c->Release();
  EXPECT_EQ(ac.queued(), 1);
}

TEST(AdmissionTest, WaitSeesCancelledPredicate) {
  AdmissionController ac(Options(1, 1));
  auto a = ac.TryAdmit();
  auto b = ac.TryAdmit();
  ASSERT_TRUE(a.ok() && b.ok());
  std::atomic<bool> cancelled{false};
  std::thread canceller([&] { cancelled = true; });
  absl::Status s = b->Wait(kNoDeadline, [&] { return cancelled.load(); });
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  canceller.join();
}

TEST(AdmissionTest, CancelWakesWait) {
  AdmissionController ac(Options(1, 1));
  auto a = ac.TryAdmit();
  auto b = ac.TryAdmit();
  ASSERT_TRUE(a.ok() && b.ok());
  std::thread canceller([&] { b->Cancel(); });
  EXPECT_EQ(b->Wait(kNoDeadline, nullptr).code(), absl::StatusCode::kCancelled);
  canceller.join();
  // A cancelled ticket stays cancelled even if later promoted.
  a->Release();
  EXPECT_TRUE(b->running());
  EXPECT_EQ(b->Wait(kNoDeadline, nullptr).code(), absl::StatusCode::kCancelled);
}

TEST(AdmissionTest, RetryHintFollowsRecentDurations) {
  absl::Time fake = absl::UnixEpoch();
  AdmissionOptions o = Options(2, 2);
  o.now = [&fake] { return fake; };
  o.initial_request_estimate = absl::Seconds(4);
  AdmissionController ac(o);
  EXPECT_EQ(ac.RetryHint(), absl::ZeroDuration());  // a slot is free

  auto a = ac.TryAdmit();
  auto b = ac.TryAdmit();
  ASSERT_TRUE(a.ok() && b.ok());
  // No history yet: 4 s * (0 queued + 1) / 2 slots.
  EXPECT_EQ(ac.RetryHint(), absl::Seconds(2));

  fake += absl::Seconds(1);
  a->Release();  // ran 1 s
  auto c = ac.TryAdmit();
  ASSERT_TRUE(c.ok());
  fake += absl::Seconds(3);
  b->Release();  // ran 4 s; mean 2.5 s
  auto d = ac.TryAdmit();
  auto e = ac.TryAdmit();
  auto f = ac.TryAdmit();
  ASSERT_TRUE(d.ok() && e.ok() && f.ok());
  EXPECT_EQ(ac.queued(), 2);
  // 2.5 s * (2 queued + 1) / 2 slots = 3.75 s.
  EXPECT_EQ(ac.RetryHint(), absl::Milliseconds(3750));
  auto g = ac.TryAdmit();
  EXPECT_THAT(std::string(g.status().message()),
              HasSubstr("2 requests running, 2 queued; retry after ~3750 ms"));
}

TEST(AdmissionTest, ZeroQueueRefusesWhenFull) {
  AdmissionController ac(Options(1, 0));
  auto a = ac.TryAdmit();
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(ac.TryAdmit().status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(AdmissionTest, ConcurrentLoadNeverExceedsBounds) {
  constexpr int kRunning = 3;
  AdmissionController ac(Options(kRunning, 5));
  std::atomic<int> inside{0};
  std::atomic<int> max_inside{0};
  std::atomic<int> completed{0};
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        auto ticket = ac.TryAdmit();
        if (!ticket.ok()) {
          ++refused;
          continue;
        }
        ASSERT_TRUE(ticket->Wait(kNoDeadline, nullptr).ok());
        const int now = ++inside;
        int prev = max_inside.load();
        while (now > prev && !max_inside.compare_exchange_weak(prev, now)) {
        }
        std::this_thread::yield();
        --inside;
        ++completed;
        EXPECT_LE(ac.queued(), 5);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(max_inside.load(), kRunning);
  EXPECT_EQ(completed + refused, 1600);
  EXPECT_EQ(ac.running(), 0);
  EXPECT_EQ(ac.queued(), 0);
}

}  // namespace
}  // namespace specserve::scheduler
