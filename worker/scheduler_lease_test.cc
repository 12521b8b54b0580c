// The session lease's arithmetic: runs out after the lease with no call,
// never while calls keep coming, and a late wake-up (the process was
// stopped) does not count in full.
#include "worker/scheduler_lease.h"

#include <atomic>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace specserve::worker {
namespace {

constexpr absl::Duration kLease = absl::Seconds(2);
constexpr absl::Duration kTick = absl::Milliseconds(500);

TEST(LeaseClockTest, RunsOutAfterTheLeaseWithNoCall) {
  LeaseClock c(kLease, kTick);
  EXPECT_FALSE(c.Check(false, kTick));
  EXPECT_FALSE(c.Check(false, kTick));
  EXPECT_FALSE(c.Check(false, kTick));
  EXPECT_TRUE(c.Check(false, kTick));
  EXPECT_TRUE(c.Check(false, kTick));  // stays out until a call comes
  EXPECT_FALSE(c.Check(true, kTick));
}

TEST(LeaseClockTest, CallsKeepItAlive) {
  LeaseClock c(kLease, kTick);
  for (int i = 0; i < 100; ++i) {
    EXPECT_FALSE(c.Check(false, kTick));
    EXPECT_FALSE(c.Check(true, kTick));
  }
}

TEST(LeaseClockTest, TimeStoppedCountsAtMostTwoTicks) {
  LeaseClock c(kLease, kTick);
  // Stopped for a minute: the wake-up counts two ticks, not the minute; the
  // scheduler's queued poll then renews the lease.
  EXPECT_FALSE(c.Check(false, absl::Minutes(1)));
  EXPECT_FALSE(c.Check(true, kTick));
  // Stopped again with no scheduler left: it still runs out, a tick later.
  EXPECT_FALSE(c.Check(false, absl::Minutes(1)));
  EXPECT_TRUE(c.Check(false, absl::Minutes(1)));
}

TEST(SchedulerLeaseTest, ReleasesOnlyWithoutCalls) {
  std::atomic<int> releases{0};
  {
    SchedulerLease lease(absl::Milliseconds(400), [&] {
      ++releases;
      return 0;
    });
    // Renewed far more often than the lease: never released.
    for (int i = 0; i < 100; ++i) {
      lease.Renew();
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_EQ(releases.load(), 0);
    // No calls: released (bounded wait, no timing asserted).
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (releases.load() == 0 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_GT(releases.load(), 0);
  }
  SchedulerLease never(absl::ZeroDuration(), [&] { return ++releases; });
}

}  // namespace
}  // namespace specserve::worker
