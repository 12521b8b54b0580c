// Runs one burst on a worker and streams its tokens back (docs/RELIABILITY.md
// rows 1–4): between events the calling thread checks a watch and cancels the
// call when the client cancels, the request is aborted, or the worker stops
// answering health checks (a hung worker never ends the stream by itself), so
// no request waits on a dead worker.
#ifndef SPECSERVE_SCHEDULER_BURST_CLIENT_H_
#define SPECSERVE_SCHEDULER_BURST_CLIENT_H_

#include <functional>
#include <optional>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "grpcpp/grpcpp.h"
#include "proto/worker.grpc.pb.h"

namespace specserve::scheduler {

struct BurstOutcome {
  grpc::Status status;
  std::optional<specserve::worker::v1::BurstSummary> summary;
  // Why the call was cancelled from our side, if it was.
  enum class CancelledBy { kNone, kClient, kWorkerDown } cancelled_by =
      CancelledBy::kNone;
};

struct BurstWatch {
  // Polled every 20 ms while the burst runs (between events).
  std::function<bool()> client_cancelled;
  std::function<bool()> worker_available;
  absl::Time deadline = absl::InfiniteFuture();
};

// `on_tokens` receives each token event on the calling thread, as it arrives
// (the watch waits while it runs); returning false cancels the burst. Returns
// when the call is over.
BurstOutcome RunBurstOnWorker(
    specserve::worker::v1::Worker::Stub* stub,
    const specserve::worker::v1::BurstRequest& request, const BurstWatch& watch,
    const std::function<bool(absl::Span<const uint32_t>)>& on_tokens);

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_BURST_CLIENT_H_
