// The scheduler's view of its workers: one gRPC channel per worker address,
// watched by a monitor thread that polls health and GetWorkerInfo.
//
// A worker is `available` while its health check answers SERVING and its info
// call succeeds within the poll deadline. A worker that dies is marked
// unavailable within one poll interval; gRPC channels reconnect on their own
// (with a short maximum backoff set here), so a restarted worker at the same
// address becomes available again without restarting the scheduler.
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

namespace specserve::scheduler {

struct WorkerPoolOptions {
  absl::Duration poll_interval = absl::Milliseconds(500);
  absl::Duration poll_deadline = absl::Milliseconds(1000);
};

class WorkerPool {
 public:
  WorkerPool(const std::vector<std::string>& addresses,
             WorkerPoolOptions options);
  ~WorkerPool();  // stops the monitor thread
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Polls every worker once, synchronously (also done by the monitor).
  void PollOnce();

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
  // Marks a worker unavailable now (a call to it failed with UNAVAILABLE);
  // the monitor marks it available again when it answers.
  void MarkUnavailable(int index, const std::string& detail);
  // Frees `session_id`'s copy on worker `index` once it answers again: the
  // copy was abandoned while the worker could not be reached (hung, or
  // unavailable), and would otherwise stay in its pool for good. The monitor
  // sends the Release when a poll succeeds, before it marks the worker
  // available again, so no new copy of the session can be placed there
  // first. A restarted worker answers NOT_FOUND, which also settles it.
  void ReleaseLater(int index, const std::string& session_id);

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

 private:
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
    specserve::worker::v1::WorkerInfo info;
  };

  Observed Poll(const Worker& w) const;
  // Sends worker i's pending releases; returns false if any is left.
  bool SendPendingReleases(int i);
  void MonitorLoop();

  const WorkerPoolOptions options_;
  std::vector<std::unique_ptr<Worker>> workers_;

  mutable absl::Mutex mu_;
  std::vector<Observed> observed_ ABSL_GUARDED_BY(mu_);
  // ReleaseLater's session ids, per worker.
  std::vector<std::vector<std::string>> pending_release_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread monitor_;
};

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_WORKER_POOL_H_
