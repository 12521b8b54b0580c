// The scheduler's view of its workers: one gRPC channel per worker address,
// each watched by its own monitor thread that polls health and GetWorkerInfo
// (so a hung worker delays no other worker's poll).
//
// A worker is `available` while its health check answers SERVING and its info
// call succeeds within the poll deadline. Slow is not down: a poll that only
// timed out is a miss, and an available worker is marked unavailable after
// `down_after_misses` consecutive misses (a suspect worker is polled again
// at once, not after the interval), so a hiccup shorter than that many poll
// deadlines takes no work away. A poll that fails outright (the connection
// is refused or reset: the process is gone; NOT_SERVING: it drains) marks it
// unavailable at once. A worker that dies is so marked within one poll
// interval, one that hangs within an interval plus down_after_misses poll
// deadlines (1.5 s by default). What a burst or session call ends with
// (CANCELLED, DEADLINE_EXCEEDED, slow) never marks a worker unavailable;
// only a failed connection does (MarkUnavailable). gRPC channels reconnect
// on their own (with a short maximum backoff set here), so a restarted
// worker at the same address becomes available again without restarting
// the scheduler.
//
// Session calls made through the pool (Admit, Park, Demote, Release) are
// watched like bursts (scheduler/burst_client.h): one still running when its
// worker is marked unavailable is cancelled at once and fails UNAVAILABLE, so
// no request waits on a hung worker past the poll that noticed it.
//
// Sessions: the monitor tells a WorkerSessionsListener (the session table,
// scheduler/residency_sync.h) what it learns about the sessions on a worker —
// that it is gone, or the exact list it holds after a restart or a change its
// pool made on its own — before that worker can be marked available again.
#ifndef SPECSERVE_SCHEDULER_WORKER_POOL_H_
#define SPECSERVE_SCHEDULER_WORKER_POOL_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/health.grpc.pb.h"
#include "proto/specserve.pb.h"
#include "proto/worker.grpc.pb.h"
#include "telemetry/tls_credentials.h"

namespace specserve::scheduler {

struct WorkerPoolOptions {
  absl::Duration poll_interval = absl::Milliseconds(500);
  // A poll (health check, then GetWorkerInfo) not answered within this is a
  // miss. Both are answered off the worker's step loop (worker_service.h),
  // in well under a millisecond on an idle one.
  absl::Duration poll_deadline = absl::Milliseconds(500);
  // Consecutive misses that mark an available worker unavailable (>= 1).
  int down_after_misses = 2;
  // A worker whose polls time out (hung, frozen, overloaded) still holds its
  // sessions and may come back: they count as lost only after it has not
  // answered for this long. One that cannot be reached at all (connection
  // refused or reset: its process is gone) loses them at once.
  absl::Duration lost_after = absl::Seconds(10);
  // How every channel to a worker is dialled (health polls, bursts, session
  // calls): plaintext by default, else TLS that verifies each worker's
  // certificate and presents the scheduler's own.
  telemetry::ChannelSecurity security;
  // The owner token every session call carries (proto/worker.proto): the
  // workers refuse calls on this scheduler's sessions without it. Secret;
  // chosen at random per start (scheduler_main).
  std::string owner;
};

// What the monitor learns about the sessions on a worker. Called on the
// monitor's thread, before the worker can be marked available again; each
// returns the ids of copies on that worker that must be released (the pool
// releases them later, like ReleaseLater). `as_of` is when the poll that
// learned it was sent: what changed after it is not described.
class WorkerSessionsListener {
 public:
  virtual ~WorkerSessionsListener() = default;
  // Worker `index` is gone (unreachable), or has not answered for
  // lost_after: no session placed there before `as_of` can be trusted.
  // Called after every such poll.
  virtual std::vector<std::string> WorkerLost(int index, absl::Time as_of) = 0;
  // Worker `index` holds exactly `list`: it restarted (a new instance), or
  // its pool changed idle sessions on its own (pool_epoch moved).
  virtual std::vector<std::string> WorkerSessions(
      int index, absl::Time as_of,
      const specserve::worker::v1::SessionList& list) = 0;
};

class WorkerPool {
 public:
  // `listener` (may be null) must outlive the pool.
  WorkerPool(const std::vector<std::string>& addresses,
             WorkerPoolOptions options,
             WorkerSessionsListener* listener = nullptr);
  ~WorkerPool();  // stops the monitor threads
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // A snapshot of every worker's status, in the order given at construction.
  std::vector<specserve::v1::WorkerStatus> Snapshot() const;
  int NumAvailable() const;
  // Whether worker `index` answered its last health poll.
  bool Available(int index) const;
  // The last WorkerInfo worker `index` reported (empty before the first).
  specserve::worker::v1::WorkerInfo Info(int index) const;
  const std::string& address(int index) const {
    return workers_[index]->address;
  }
  // Marks a worker unavailable now (a call to it could not connect: it
  // failed with UNAVAILABLE from the transport, not from our own cancel);
  // the monitor marks it available again when a poll sent after this
  // answers (one already in flight may predate the failure).
  void MarkUnavailable(int index, const std::string& detail);
  // Frees `session_id`'s copy on worker `index` once it answers again: the
  // copy was abandoned while the worker could not be reached (hung, or
  // unavailable), and would otherwise stay in its pool for good. The monitor
  // sends the Release when a poll succeeds, before it marks the worker
  // available again, so no new copy of the session can be placed there
  // first. A restarted worker answers NOT_FOUND, which also settles it.
  void ReleaseLater(int index, const std::string& session_id);

  // Session calls, watched (see the top of this file): each fails
  // UNAVAILABLE as soon as worker `index` is marked unavailable.
  //
  // Admit: create (and prefill) a session copy until `deadline`. A call
  // given up on (worker unavailable, deadline, cancelled) may still leave a
  // copy there: it is released now or later (ReleaseNowOrLater).
  grpc::Status Admit(int index,
                     const specserve::worker::v1::AdmitRequest& request,
                     absl::Time deadline,
                     specserve::worker::v1::SessionState* state);
  // One Release RPC for `session_id` on worker `index`.
  grpc::Status Release(int index, const std::string& session_id,
                       absl::Duration timeout) const;
  // Frees `session_id` on worker `index` now if it answers, else later
  // (ReleaseLater). NOT_FOUND (nothing there) settles it too. Best effort.
  void ReleaseNowOrLater(int index, const std::string& session_id);
  // Park (flush, keep warm) and Demote (one-way to batched decode) of one
  // session; `state` gets the worker's view afterwards.
  grpc::Status Park(int index, const std::string& session_id,
                    absl::Duration timeout,
                    specserve::worker::v1::SessionState* state) const;
  grpc::Status Demote(int index, const std::string& session_id,
                      absl::Duration timeout,
                      specserve::worker::v1::SessionState* state) const;

  // The stub of worker `index` (for dispatching bursts).
  specserve::worker::v1::Worker::Stub* stub(int index) const {
    return workers_[index]->stub.get();
  }
  int size() const { return static_cast<int>(workers_.size()); }
  // WorkerPoolOptions::owner, for the calls made with stub().
  const std::string& owner() const { return options_.owner; }

 private:
  // A Stub's PrepareAsync method of a call on one session (Park, Demote).
  using PrepareSessionCall = std::unique_ptr<
      grpc::ClientAsyncResponseReader<specserve::worker::v1::SessionState>> (
      specserve::worker::v1::Worker::Stub::*)(
      grpc::ClientContext*, const specserve::worker::v1::SessionRef&,
      grpc::CompletionQueue*);
  // `prepare` watched like every session call (see Admit).
  grpc::Status SessionStateCall(int index, const std::string& session_id,
                                absl::Duration timeout,
                                specserve::worker::v1::SessionState* state,
                                PrepareSessionCall prepare) const;
  struct Worker {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<specserve::worker::v1::Worker::Stub> stub;
    std::unique_ptr<grpc::health::v1::Health::Stub> health;
  };
  struct Observed {
    bool available = false;
    std::string detail = "not polled yet";
    absl::Time last_seen = absl::InfinitePast();
    specserve::worker::v1::WorkerInfo info;  // without its session_list
    // The poll could not reach the process at all (its port refuses or
    // resets connections), as opposed to a call that timed out.
    bool unreachable = false;
    // The poll failed only by timing out (a miss; see the top of this file).
    bool timed_out = false;
    // Consecutive misses up to this poll.
    int misses = 0;
    // The (instance, pool_epoch) of the last session list handed to the
    // listener: the worker sends a new list only when either moves.
    uint64_t list_instance = 0;
    uint64_t list_epoch = 0;
    // When MarkUnavailable was last called: a poll sent before it cannot
    // make the worker available again.
    absl::Time marked_unavailable = absl::InfinitePast();
  };

  Observed Poll(const Worker& w, uint64_t list_instance,
                uint64_t list_epoch) const;
  // One poll of worker i and what follows from it (listener, releases).
  // Returns whether worker i is suspect (available, its last poll missed):
  // it is then polled again at once.
  bool PollWorker(int i);
  // Sends worker i's pending releases; returns false if any is left.
  bool SendPendingReleases(int i);
  // Release without the watch (the monitor's, while i is unavailable).
  grpc::Status ReleaseCall(int index, const std::string& session_id,
                           absl::Duration timeout) const;
  void MonitorLoop(int i);

  const WorkerPoolOptions options_;
  WorkerSessionsListener* const listener_;
  std::vector<std::unique_ptr<Worker>> workers_;

  mutable absl::Mutex mu_;
  std::vector<Observed> observed_ ABSL_GUARDED_BY(mu_);
  // ReleaseLater's session ids, per worker.
  std::vector<std::vector<std::string>> pending_release_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> monitors_;  // one per worker
};

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_WORKER_POOL_H_
