#include "scheduler/burst_client.h"

#include <atomic>

#include "absl/synchronization/notification.h"

namespace specserve::scheduler {
namespace {

using specserve::worker::v1::BurstEvent;

// Reads the burst stream on gRPC's own threads: each token event is handed
// to `on_tokens` where it arrives, with no wake-up of the calling thread per
// token (thread hand-offs dominated the scheduler's per-token cost).
class BurstReader final : public grpc::ClientReadReactor<BurstEvent> {
 public:
  BurstReader(grpc::ClientContext* ctx,
              const std::function<bool(absl::Span<const uint32_t>)>* on_tokens,
              BurstOutcome* out, std::atomic<int>* cancelled_by)
      : ctx_(ctx), on_tokens_(on_tokens), out_(out),
        cancelled_by_(cancelled_by) {}

  void Start() {
    StartRead(&event_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows
    if (event_.has_tokens()) {
      const auto& ids = event_.tokens().ids();
      if (!stopped_ && !(*on_tokens_)(absl::MakeConstSpan(ids.data(), ids.size()))) {
        stopped_ = true;
        *cancelled_by_ = 1;
        ctx_->TryCancel();
      }
    } else if (event_.has_summary()) {
      out_->summary = event_.summary();
    }
    StartRead(&event_);
  }

  void OnDone(const grpc::Status& s) override {
    out_->status = s;
    done_.Notify();
  }

  // True once the call is over (OnDone ran).
  bool WaitDone(absl::Duration timeout) {
    return done_.WaitForNotificationWithTimeout(timeout);
  }

 private:
  grpc::ClientContext* const ctx_;
  const std::function<bool(absl::Span<const uint32_t>)>* const on_tokens_;
  BurstOutcome* const out_;
  std::atomic<int>* const cancelled_by_;
  BurstEvent event_;
  bool stopped_ = false;  // only touched by OnReadDone (serialized by gRPC)
  absl::Notification done_;
};

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
  std::atomic<int> cancelled_by{0};
  BurstReader reader(&ctx, &on_tokens, &out, &cancelled_by);
  stub->async()->Burst(&ctx, &request, &reader);
  reader.Start();
  // The calling thread only watches: a worker that hangs sends nothing, so
  // only an outside check can end the call.
  while (!reader.WaitDone(absl::Milliseconds(20))) {
    if (cancelled_by != 0) continue;  // already cancelling
    if (watch.client_cancelled && watch.client_cancelled()) {
      cancelled_by = 1;
      ctx.TryCancel();
    } else if (watch.worker_available && !watch.worker_available()) {
      cancelled_by = 2;
      ctx.TryCancel();
    }
  }
  if (cancelled_by == 1) out.cancelled_by = BurstOutcome::CancelledBy::kClient;
  if (cancelled_by == 2) {
    out.cancelled_by = BurstOutcome::CancelledBy::kWorkerDown;
  }
  return out;
}

}  // namespace specserve::scheduler
