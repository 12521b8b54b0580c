// A server-streaming reactor fed by a producer thread (the callback API's
// reactions must never block, so request work runs on its own thread and
// hands messages over here).
//
// Lifetime: the reactor deletes itself once BOTH gRPC has called OnDone() and
// the producer has called Done(). Until then either side may still touch it.
// Writes are queued and sent one at a time (gRPC allows one outstanding write);
// Finish() is sent after the queue drains. After a cancellation Write() returns
// false and queued messages are dropped.
//
// Coalescing: a subclass may override Merge() to fold a new message into the
// last queued one while a write is in flight (e.g. consecutive token deltas),
// so a slow reader gets fewer, larger messages and no added latency.
#ifndef SPECSERVE_TELEMETRY_STREAM_REACTOR_H_
#define SPECSERVE_TELEMETRY_STREAM_REACTOR_H_

#include <deque>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"

namespace specserve::telemetry {

template <typename T>
class StreamReactor : public grpc::ServerWriteReactor<T> {
 public:
  StreamReactor() = default;

  // Producer side. Returns false once the call is cancelled or finished.
  bool Write(T message) {
    Action action;
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_ || finish_requested_) return false;
      // queue_.front() is being written while write_in_flight_; anything
      // behind it has not been handed to gRPC and may still grow.
      if (!(write_in_flight_ && queue_.size() >= 2 &&
            Merge(&queue_.back(), message))) {
        queue_.push_back(std::move(message));
      }
      action = NextActionLocked();
    }
    Run(action);
    return true;
  }

  // Ends the call with `status` after every queued message is sent.
  void Finish(grpc::Status status) {
    Action action;
    {
      absl::MutexLock lock(&mu_);
      if (finish_requested_) return;
      finish_requested_ = true;
      status_ = std::move(status);
      action = NextActionLocked();
    }
    Run(action);
  }

  bool cancelled() const {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }

  // Blocks until the client cancels or `timeout` passes; returns cancelled().
  bool WaitCancelled(absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&cancelled_), timeout);
    return cancelled_;
  }

  // The producer will not touch the reactor again.
  void Done() { Unref(); }

  // Folds `next` into `into` (a queued message not yet sent) and returns
  // true, or returns false to queue `next` separately. Called under the lock.
  virtual bool Merge(T* into, const T& next) { return false; }

  // ---- gRPC reactions (never block).
  void OnWriteDone(bool ok) override {
    Action action;
    {
      absl::MutexLock lock(&mu_);
      write_in_flight_ = false;
      queue_.pop_front();
      if (!ok) cancelled_ = true;
      action = NextActionLocked();
    }
    Run(action);
  }
  void OnCancel() override {
    Action action;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      action = NextActionLocked();
    }
    Run(action);
  }
  void OnDone() override { Unref(); }

 private:
  enum class Action { kNone, kWrite, kFinish };

  // Decides the next step; StartWrite/Finish run outside the lock because
  // gRPC may call a reaction inline from them.
  Action NextActionLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (write_in_flight_ || finish_called_) return Action::kNone;
    if (cancelled_) {
      // Nothing more reaches a cancelled client; the call still needs a
      // Finish() to reach OnDone().
      queue_.clear();
      if (!finish_requested_) status_ = grpc::Status::CANCELLED;
      finish_called_ = true;
      return Action::kFinish;
    }
    if (!queue_.empty()) {
      write_in_flight_ = true;
      next_ = &queue_.front();
      return Action::kWrite;
    }
    if (finish_requested_) {
      finish_called_ = true;
      return Action::kFinish;
    }
    return Action::kNone;
  }

  void Run(Action action) {
    switch (action) {
      case Action::kNone:
        return;
      case Action::kWrite: {
        const T* message;
        {
          absl::MutexLock lock(&mu_);
          message = next_;
        }
        this->StartWrite(message);
        return;
      }
      case Action::kFinish: {
        grpc::Status status;
        {
          absl::MutexLock lock(&mu_);
          status = status_;
        }
        grpc::ServerWriteReactor<T>::Finish(status);
        return;
      }
    }
  }

  void Unref() {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      last = --refs_ == 0;
    }
    if (last) delete this;
  }

  mutable absl::Mutex mu_;
  // The message being written stays at the front until OnWriteDone.
  std::deque<T> queue_ ABSL_GUARDED_BY(mu_);
  const T* next_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  int refs_ ABSL_GUARDED_BY(mu_) = 2;  // gRPC (OnDone) + the producer (Done)
};

}  // namespace specserve::telemetry

#endif  // SPECSERVE_TELEMETRY_STREAM_REACTOR_H_
