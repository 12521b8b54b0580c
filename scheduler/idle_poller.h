// Keeps one thread, not two, waiting in epoll while a token stream runs.
//
// gRPC 1.51's epoll engine lets one thread at a time wait in epoll; when that
// thread wakes it first hands the role to another waiting thread, then handles
// the event. With the server's idle thread and a request's thread both
// waiting, every token streamed from a worker to a client woke two threads
// (measured: most of the scheduler's CPU per token). So the server is built
// "hybrid": the completion queue added here makes gRPC park its synchronous
// threads on queues that do not poll, and this class's thread is the one that
// polls while no request is streaming. While a burst streams (a
// StreamingScope is alive) it steps aside, and the request's thread, waiting
// on its burst queue, is the only poller: one wake-up per token, straight from
// epoll.
//
// Invariant (no call is ever left unread): while no StreamingScope is alive
// the idle thread polls; while one is, its thread waits only in gRPC calls
// that poll (its burst queue, its client writes, its worker calls), apart from
// short lock waits.
#ifndef SPECSERVE_SCHEDULER_IDLE_POLLER_H_
#define SPECSERVE_SCHEDULER_IDLE_POLLER_H_

#include <memory>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "grpcpp/alarm.h"
#include "grpcpp/grpcpp.h"

namespace specserve::scheduler {

class IdlePoller {
 public:
  // Adds the polled queue to `builder`; call before BuildAndStart.
  explicit IdlePoller(grpc::ServerBuilder* builder);
  IdlePoller(const IdlePoller&) = delete;
  IdlePoller& operator=(const IdlePoller&) = delete;
  ~IdlePoller();  // Stop()s

  // Starts polling; after BuildAndStart.
  void Start();
  // Ends the thread; after the server has shut down.
  void Stop();

  // While alive, the idle thread does not poll. Null `poller`: no effect.
  class StreamingScope {
   public:
    explicit StreamingScope(IdlePoller* poller) : poller_(poller) {
      if (poller_ != nullptr) poller_->Enter();
    }
    ~StreamingScope() {
      if (poller_ != nullptr) poller_->Exit();
    }
    StreamingScope(const StreamingScope&) = delete;
    StreamingScope& operator=(const StreamingScope&) = delete;

   private:
    IdlePoller* const poller_;
  };

 private:
  void Enter();
  void Exit();
  void Loop();

  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  absl::Mutex mu_;
  int streaming_ ABSL_GUARDED_BY(mu_) = 0;
  // Fires on cq_ to get the idle thread out of epoll when a stream starts;
  // replaced once its tag has come back.
  std::unique_ptr<grpc::Alarm> wake_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_IDLE_POLLER_H_
