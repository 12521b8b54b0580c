#include "scheduler/idle_poller.h"

#include <chrono>

namespace specserve::scheduler {
namespace {

void* const kWakeTag = reinterpret_cast<void*>(1);

}  // namespace

IdlePoller::IdlePoller(grpc::ServerBuilder* builder)
    : cq_(builder->AddCompletionQueue(/*is_frequently_polled=*/true)) {}

IdlePoller::~IdlePoller() { Stop(); }

void IdlePoller::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void IdlePoller::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    stop_ = true;
    wake_.reset();  // a pending alarm's tag comes back (cancelled) first
  }
  cq_->Shutdown();
  if (thread_.joinable()) {
    thread_.join();
  } else {  // never started: drain here
    void* tag;
    bool ok;
    while (cq_->Next(&tag, &ok)) {
    }
  }
}

void IdlePoller::Enter() {
  absl::MutexLock lock(&mu_);
  if (++streaming_ == 1 && wake_ == nullptr && !stop_) {
    wake_ = std::make_unique<grpc::Alarm>();
    wake_->Set(cq_.get(), std::chrono::system_clock::now(), kWakeTag);
  }
}

void IdlePoller::Exit() {
  absl::MutexLock lock(&mu_);
  --streaming_;  // wakes Loop's Await when it reaches 0
}

void IdlePoller::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](IdlePoller* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
            return p->stop_ || p->streaming_ == 0;
          },
          this));
    }
    void* tag;
    bool ok;
    // Polls until the wake alarm (a stream started) or shutdown.
    const auto next = cq_->AsyncNext(
        &tag, &ok, std::chrono::system_clock::now() + std::chrono::seconds(1));
    if (next == grpc::CompletionQueue::SHUTDOWN) return;
    if (next == grpc::CompletionQueue::GOT_EVENT && tag == kWakeTag) {
      absl::MutexLock lock(&mu_);
      wake_.reset();
    }
  }
}

}  // namespace specserve::scheduler
