#include "scheduler/burst_client.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "glog/logging.h"

namespace specserve::scheduler {
namespace {

using specserve::worker::v1::BurstEvent;

// Completion-queue tags of the one stream this queue carries.
enum Tag : intptr_t { kStart = 1, kRead, kFinish };

void* AsTag(Tag t) { return reinterpret_cast<void*>(t); }

// How often the watch is polled while no event arrives.
constexpr auto kWatchInterval = std::chrono::milliseconds(20);
// Bound of one StopBurst call (the worker answers it without waiting).
constexpr absl::Duration kStopCallTimeout = absl::Milliseconds(500);

// Asks the worker to end the session's burst at its next round boundary.
// NOT_FOUND: its burst is not running yet (the Burst call is still on its
// way) or is already over (its summary is on its way).
grpc::Status SendStopBurst(specserve::worker::v1::Worker::Stub* stub,
                           const std::string& session_id,
                           const std::string& owner, absl::Time until) {
  grpc::ClientContext ctx;
  ctx.set_deadline(
      absl::ToChronoTime(std::min(until, absl::Now() + kStopCallTimeout)));
  specserve::worker::v1::SessionRef ref;
  ref.set_session_id(session_id);
  ref.set_owner(owner);
  specserve::worker::v1::StopBurstResponse response;
  return stub->StopBurst(&ctx, ref, &response);
}

}  // namespace

BurstOutcome RunBurstOnWorker(
    specserve::worker::v1::Worker::Stub* stub,
    const specserve::worker::v1::BurstRequest& request, const BurstWatch& watch,
    const std::function<bool(absl::Span<const uint32_t>)>& on_tokens) {
  return RunBurstOnWorker(
      stub, request, watch,
      [&](absl::Span<const uint32_t> ids,
          const google::protobuf::RepeatedPtrField<
              specserve::v1::TokenLogprobs>&) { return on_tokens(ids); });
}

BurstOutcome RunBurstOnWorker(
    specserve::worker::v1::Worker::Stub* stub,
    const specserve::worker::v1::BurstRequest& request, const BurstWatch& watch,
    const BurstTokensFn& on_tokens) {
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
  // Once a stop is asked for: until when the burst may take to end, and
  // whether the worker has taken the stop (StopBurst answered OK; until
  // then it is sent again at every watch).
  absl::Time stop_until = absl::InfiniteFuture();
  bool stop_taken = false;
  auto send_stop = [&] {
    const absl::Time until = std::min(stop_until, watch.deadline);
    stop_taken =
        SendStopBurst(stub, request.session_id(), request.owner(), until).ok();
  };
  auto request_stop = [&] {
    if (out.stop_requested) return;
    out.stop_requested = true;
    stop_until = absl::Now() + watch.stop_grace;
    send_stop();
  };
  // The watch runs every kWatchInterval whether or not events arrive: a
  // worker that hangs sends nothing (only the watch ends the call), and a
  // steady stream must not delay noticing a cancel.
  auto next_watch = std::chrono::system_clock::now() + kWatchInterval;
  auto run_watch = [&] {
    next_watch = std::chrono::system_clock::now() + kWatchInterval;
    if (out.cancelled_by != BurstOutcome::CancelledBy::kNone) return;
    // The burst is over once its summary is in (only the status is left to
    // come): cancelling now would only throw the summary away.
    if (out.summary) return;
    if (!out.stop_requested && watch.client_cancelled &&
        watch.client_cancelled()) {
      request_stop();
    }
    if (watch.worker_available && !watch.worker_available()) {
      out.cancelled_by = BurstOutcome::CancelledBy::kWorkerDown;
      ctx.TryCancel();
      return;
    }
    if (!out.stop_requested) return;
    const absl::Time now = absl::Now();
    if (now >= stop_until || now >= watch.deadline) {
      out.cancelled_by = BurstOutcome::CancelledBy::kClient;
      ctx.TryCancel();
    } else if (!stop_taken) {
      send_stop();
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
          if (!on_tokens(absl::MakeConstSpan(ids.data(), ids.size()),
                         event.logprobs())) {
            request_stop();
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
