#include "worker/scheduler_lease.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "glog/logging.h"

namespace specserve::worker {

bool LeaseClock::Check(bool renewed, absl::Duration elapsed) {
  if (renewed) {
    unclaimed_ = absl::ZeroDuration();
    return false;
  }
  // A late wake-up is time the process did not run (see the header).
  unclaimed_ += std::min(elapsed, 2 * interval_);
  return unclaimed_ >= lease_;
}

absl::Duration SchedulerLease::CheckInterval(absl::Duration lease) {
  return std::clamp(lease / 4, absl::Milliseconds(10), absl::Seconds(1));
}

SchedulerLease::SchedulerLease(absl::Duration lease,
                               std::function<int()> release_idle)
    : release_idle_(std::move(release_idle)) {
  if (lease > absl::ZeroDuration()) {
    thread_ = std::thread([this, lease] { Loop(lease); });
  }
}

SchedulerLease::~SchedulerLease() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void SchedulerLease::Loop(absl::Duration lease) {
  const absl::Duration interval = CheckInterval(lease);
  LeaseClock clock(lease, interval);
  absl::Time last = absl::Now();
  while (!stop_.WaitForNotificationWithTimeout(interval)) {
    const absl::Time now = absl::Now();
    const bool renewed = renewed_.exchange(false, std::memory_order_relaxed);
    if (clock.Check(renewed, now - last)) {
      const int n = release_idle_();
      if (n > 0) {
        LOG(INFO) << "released " << n << " idle session(s): no scheduler "
                  << "called for " << absl::FormatDuration(lease)
                  << " (--session_lease_seconds)";
      }
    }
    last = now;
  }
}

}  // namespace specserve::worker
