// Runs one burst on a worker and streams its tokens back (docs/RELIABILITY.md
// rows 1–4): between events the calling thread checks a watch. When the
// client cancels or the request is aborted, the worker is asked to stop the
// burst at its next round boundary (Worker.StopBurst) and the stream is read
// on to its summary, so the caller learns every token the worker committed
// and the session copy stays usable; a worker that does not stop within the
// watch's stop_grace has the call cancelled. A worker that stops answering
// health checks has the call cancelled at once (a hung worker never ends the
// stream by itself), so no request waits on a dead worker.
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
  // The burst was asked to stop (client_cancelled, or on_tokens returned
  // false). With a summary it ended at a round boundary and on_tokens got
  // every token it committed; without one, what it committed is unknown.
  bool stop_requested = false;
  // Why the call was cancelled from our side, if it was: kClient when a
  // requested stop did not end the burst within stop_grace (or the deadline
  // passed first).
  enum class CancelledBy {
    kNone,
    kClient,
    kWorkerDown
  } cancelled_by = CancelledBy::kNone;
};

struct BurstWatch {
  // Polled every 20 ms while the burst runs (between events).
  std::function<bool()> client_cancelled;
  std::function<bool()> worker_available;
  absl::Time deadline = absl::InfiniteFuture();
  // How long a burst asked to stop may take to send its summary.
  absl::Duration stop_grace = absl::Seconds(2);
};

// Receives one token event: its ids and, when the request asked for
// logprobs, one TokenLogprobs per id (empty otherwise).
using BurstTokensFn =
    std::function<bool(absl::Span<const uint32_t> ids,
                       const google::protobuf::RepeatedPtrField<
                           specserve::v1::TokenLogprobs>& logprobs)>;

// `on_tokens` receives each token event on the calling thread, as it arrives
// (the watch waits while it runs); returning false asks the worker to stop
// the burst, like client_cancelled. Tokens that arrive after a stop was
// asked for are still passed to it: the worker committed them. Returns when
// the call is over.
BurstOutcome RunBurstOnWorker(
    specserve::worker::v1::Worker::Stub* stub,
    const specserve::worker::v1::BurstRequest& request, const BurstWatch& watch,
    const BurstTokensFn& on_tokens);
// The same, for callers that read the ids only.
BurstOutcome RunBurstOnWorker(
    specserve::worker::v1::Worker::Stub* stub,
    const specserve::worker::v1::BurstRequest& request, const BurstWatch& watch,
    const std::function<bool(absl::Span<const uint32_t>)>& on_tokens);

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_BURST_CLIENT_H_
