// Bounded admission of Generate requests (docs/RELIABILITY.md row 5): at most
// `max_running` requests hold a running slot and at most `max_queued` wait for
// one, in FIFO order; anything beyond is refused at once with
// RESOURCE_EXHAUSTED and a retry hint, before the request is tokenized.
//
// Usage (on the request's own thread, not in a gRPC reaction):
//   SS_ASSIGN_OR_RETURN(AdmissionTicket ticket, admission.TryAdmit());
//   SS_RETURN_IF_ERROR(
//       ticket.Wait(deadline, [&] { return ctx->IsCancelled(); }));
//   ... run the request ...
//   // ~AdmissionTicket frees the slot (or the queue place) and promotes the
//   // next queued request.
// From another thread (e.g. a reactor's OnCancel), ticket.Cancel() wakes a
// blocked Wait at once; the predicate is also polled every `poll_interval`.
//
// Invariants (under the controller's mutex):
// - running <= max_running, queue.size() <= max_queued.
// - Promotion is eager: whenever a slot frees, the queue's head is promoted
//   (marked running) immediately, whether or not its holder is waiting yet. So
//   a free slot and a non-empty queue never coexist, and FIFO order holds.
// - Every ticket is counted exactly once (running or queued) until destroyed.
// The controller must outlive its tickets.
#ifndef SPECSERVE_SCHEDULER_ADMISSION_H_
#define SPECSERVE_SCHEDULER_ADMISSION_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace specserve::scheduler {

struct AdmissionOptions {
  int max_running = 64;
  int max_queued = 256;
  // Estimate of one request's running time before any has finished; the
  // retry hint then follows the mean of the last `history` durations.
  absl::Duration initial_request_estimate = absl::Seconds(2);
  int history = 64;
  // How often Wait re-checks its cancellation predicate.
  absl::Duration poll_interval = absl::Milliseconds(20);
  // Clock (tests pass a fake one to drive duration statistics).
  std::function<absl::Time()> now = [] { return absl::Now(); };
};

class AdmissionController;

// A place in the admission system: a running slot, or a place in the queue
// until promoted. Move-only; destroying it releases what it holds.
class AdmissionTicket {
 public:
  AdmissionTicket() = default;
  AdmissionTicket(AdmissionTicket&& other) noexcept;
  AdmissionTicket& operator=(AdmissionTicket&& other) noexcept;
  ~AdmissionTicket();

  // True once the ticket holds a running slot.
  bool running() const;
  // Blocks until the ticket holds a running slot (OK), the deadline passes
  // (DEADLINE_EXCEEDED), or `cancelled` returns true / Cancel() is called
  // (CANCELLED). On error the ticket still holds its queue place until
  // destroyed; destroy it promptly. `cancelled` may be null; it is called
  // under the controller's lock, so it must be cheap and must not call into
  // the controller (ServerContext::IsCancelled qualifies). The deadline is
  // real time (absl::Now), independent of AdmissionOptions::now.
  absl::Status Wait(absl::Time deadline, std::function<bool()> cancelled);
  // Marks the ticket cancelled and wakes its Wait. Thread-safe.
  void Cancel();
  // Releases the slot or queue place now (the destructor does the same).
  void Release();
  bool valid() const { return controller_ != nullptr; }

 private:
  friend class AdmissionController;
  AdmissionTicket(AdmissionController* controller, uint64_t id)
      : controller_(controller), id_(id) {}
  AdmissionController* controller_ = nullptr;
  uint64_t id_ = 0;
};

class AdmissionController {
 public:
  explicit AdmissionController(AdmissionOptions options);
  ~AdmissionController();
  AdmissionController(const AdmissionController&) = delete;
  AdmissionController& operator=(const AdmissionController&) = delete;

  // A running slot if one is free, else a queue place if the queue has room,
  // else RESOURCE_EXHAUSTED "server busy: N requests running, M queued; retry
  // after ~X ms".
  absl::StatusOr<AdmissionTicket> TryAdmit();

  int running() const;
  int queued() const;
  // The current retry hint: the expected wait for a new request to start.
  absl::Duration RetryHint() const;

 private:
  friend class AdmissionTicket;
  struct Entry {
    bool running = false;
    bool cancelled = false;
    absl::Time started;  // when it got its running slot
  };

  bool IsRunning(uint64_t id) const;
  absl::Status Wait(uint64_t id, absl::Time deadline,
                    const std::function<bool()>& cancelled);
  void Cancel(uint64_t id);
  void Release(uint64_t id);
  // Moves queue heads into free running slots.
  void PromoteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordDurationLocked(absl::Duration d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration RetryHintLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const AdmissionOptions options_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> queue_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::Duration> durations_ ABSL_GUARDED_BY(mu_);
  absl::Duration durations_sum_ ABSL_GUARDED_BY(mu_);
};

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_ADMISSION_H_
