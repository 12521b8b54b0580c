// The worker's session lease (specserve_worker --session_lease_seconds): a
// scheduler that exits (or crashes) leaves its sessions' caches on the
// worker, where nothing would ever free them. So the worker releases every
// idle session once no scheduler has called for the lease time. The
// scheduler's health poll (GetWorkerInfo with claim_sessions, every
// --worker_poll_ms) and every session call renew the lease, so while a
// scheduler runs nothing is released.
//
// Only time the process runs counts: a check that wakes much later than
// planned (the process was stopped by SIGSTOP, or starved) counts at most
// two check intervals. A worker frozen for longer than the lease therefore
// keeps its sessions as it wakes, until its scheduler's next poll renews
// the lease.
#ifndef SPECSERVE_WORKER_SCHEDULER_LEASE_H_
#define SPECSERVE_WORKER_SCHEDULER_LEASE_H_

#include <atomic>
#include <functional>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace specserve::worker {

// The lease's arithmetic, apart from threads and clocks (for tests).
class LeaseClock {
 public:
  LeaseClock(absl::Duration lease, absl::Duration interval)
      : lease_(lease), interval_(interval) {}
  // One check, `elapsed` after the previous one; `renewed`: a scheduler
  // called since. True while the lease has run out.
  bool Check(bool renewed, absl::Duration elapsed);

 private:
  const absl::Duration lease_;
  const absl::Duration interval_;
  absl::Duration unclaimed_ = absl::ZeroDuration();
};

class SchedulerLease {
 public:
  // `release_idle` frees every idle session and returns how many; it runs
  // on the lease's own thread. A lease of zero never runs out (no thread).
  SchedulerLease(absl::Duration lease, std::function<int()> release_idle);
  ~SchedulerLease();  // stops the thread
  SchedulerLease(const SchedulerLease&) = delete;
  SchedulerLease& operator=(const SchedulerLease&) = delete;

  // A scheduler called. Cheap: one relaxed store, on every session call.
  void Renew() { renewed_.store(true, std::memory_order_relaxed); }

  // How often the lease is checked: a quarter of it, within [10 ms, 1 s].
  static absl::Duration CheckInterval(absl::Duration lease);

 private:
  void Loop(absl::Duration lease);

  const std::function<int()> release_idle_;
  std::atomic<bool> renewed_{true};  // start-up counts as a call
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace specserve::worker

#endif  // SPECSERVE_WORKER_SCHEDULER_LEASE_H_
