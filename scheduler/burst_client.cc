#include "scheduler/burst_client.h"

#include <chrono>

#include "glog/logging.h"

namespace specserve::scheduler {
namespace {

using specserve::worker::v1::BurstEvent;

// Completion-queue tags of the one stream this queue carries.
enum Tag : intptr_t { kStart = 1, kRead, kFinish };

void* AsTag(Tag t) { return reinterpret_cast<void*>(t); }

// How often the watch is polled while no event arrives.
constexpr auto kWatchInterval = std::chrono::milliseconds(20);

}  // namespace

BurstOutcome RunBurstOnWorker(
    specserve::worker::v1::Worker::Stub* stub,
    const specserve::worker::v1::BurstRequest& request, const BurstWatch& watch,
    const std::function<bool(absl::Span<const uint32_t>)>& on_tokens) {
  BurstOutcome out;
  grpc::ClientContext ctx;
  if (watch.deadline != absl::InfiniteFuture()) {
    ctx.set_deadline(absl::ToChronoTime(watch.deadline));
  }
  // The stream is driven from the calling thread through a queue only it
  // waits on, and the watch runs between events. Under the caller's
  // IdlePoller::StreamingScope this thread is the process's only poller while
  // it waits (scheduler/idle_poller.h): it wakes straight from epoll for each
  // token event and handles it, with no other thread involved.
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::ClientAsyncReader<BurstEvent>> reader =
      stub->PrepareAsyncBurst(&ctx, request, &cq);
  BurstEvent event;
  reader->StartCall(AsTag(kStart));
  reader->Read(&event, AsTag(kRead));
  // Invariant: exactly one of Read and Finish is outstanding until Finish's
  // tag returns; the start tag returns once on the way.
  bool finished = false;
  bool stopped = false;  // on_tokens asked to stop: tokens are no longer fed
  // The watch runs every kWatchInterval whether or not events arrive: a
  // worker that hangs sends nothing (only the watch ends the call), and a
  // steady stream must not delay noticing a cancel.
  auto next_watch = std::chrono::system_clock::now() + kWatchInterval;
  auto run_watch = [&] {
    next_watch = std::chrono::system_clock::now() + kWatchInterval;
    if (out.cancelled_by != BurstOutcome::CancelledBy::kNone) return;
    if (watch.client_cancelled && watch.client_cancelled()) {
      out.cancelled_by = BurstOutcome::CancelledBy::kClient;
      ctx.TryCancel();
    } else if (watch.worker_available && !watch.worker_available()) {
      out.cancelled_by = BurstOutcome::CancelledBy::kWorkerDown;
      ctx.TryCancel();
    }
  };
  while (!finished) {
    void* tag = nullptr;
    bool ok = false;
    const auto next = cq.AsyncNext(&tag, &ok, next_watch);
    if (next == grpc::CompletionQueue::TIMEOUT) {
      run_watch();
      continue;
    }
    if (std::chrono::system_clock::now() >= next_watch) run_watch();
    CHECK(next == grpc::CompletionQueue::GOT_EVENT) << "burst queue shut down";
    switch (static_cast<Tag>(reinterpret_cast<intptr_t>(tag))) {
      case kStart:
        break;  // a failed start also fails the read
      case kRead:
        if (!ok) {  // the stream ended
          reader->Finish(&out.status, AsTag(kFinish));
          break;
        }
        if (event.has_tokens()) {
          const auto& ids = event.tokens().ids();
          if (!stopped &&
              !on_tokens(absl::MakeConstSpan(ids.data(), ids.size()))) {
            stopped = true;
            out.cancelled_by = BurstOutcome::CancelledBy::kClient;
            ctx.TryCancel();
          }
        } else if (event.has_summary()) {
          out.summary = std::move(*event.mutable_summary());
        }
        reader->Read(&event, AsTag(kRead));
        break;
      case kFinish:
        finished = true;
        break;
    }
  }
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  return out;
}

}  // namespace specserve::scheduler
