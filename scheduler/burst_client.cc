#include "scheduler/burst_client.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"

namespace specserve::scheduler {

BurstOutcome RunBurstOnWorker(
    specserve::worker::v1::Worker::Stub* stub,
    const specserve::worker::v1::BurstRequest& request, const BurstWatch& watch,
    const std::function<bool(absl::Span<const uint32_t>)>& on_tokens) {
  BurstOutcome out;
  grpc::ClientContext ctx;
  if (watch.deadline != absl::InfiniteFuture()) {
    ctx.set_deadline(absl::ToChronoTime(watch.deadline));
  }
  std::atomic<int> cancelled_by{0};
  absl::Notification done;
  // The watcher: a worker that hangs sends nothing, so only an outside check
  // can end the call.
  std::thread watcher([&] {
    while (!done.WaitForNotificationWithTimeout(absl::Milliseconds(20))) {
      if (watch.client_cancelled && watch.client_cancelled()) {
        cancelled_by = 1;
        ctx.TryCancel();
        return;
      }
      if (watch.worker_available && !watch.worker_available()) {
        cancelled_by = 2;
        ctx.TryCancel();
        return;
      }
    }
  });
  std::unique_ptr<grpc::ClientReader<specserve::worker::v1::BurstEvent>> reader =
      stub->Burst(&ctx, request);
  specserve::worker::v1::BurstEvent event;
  while (reader->Read(&event)) {
    if (event.has_tokens()) {
      const auto& ids = event.tokens().ids();
      if (!on_tokens(absl::MakeConstSpan(ids.data(), ids.size()))) {
        cancelled_by = 1;
        ctx.TryCancel();
      }
    } else if (event.has_summary()) {
      out.summary = event.summary();
    }
  }
  out.status = reader->Finish();
  done.Notify();
  watcher.join();
  if (cancelled_by == 1) out.cancelled_by = BurstOutcome::CancelledBy::kClient;
  if (cancelled_by == 2) {
    out.cancelled_by = BurstOutcome::CancelledBy::kWorkerDown;
  }
  return out;
}

}  // namespace specserve::scheduler
