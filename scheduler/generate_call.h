// One Generate request, run to completion on its own thread: admission wait,
// tokenization, the session turn (create / append / continue / rewind),
// placement and rebuild of lost sessions, the spec gate, bursts on the worker,
// stop tokens and strings, the final event, parking.
//
// Consistency rule: the session table's history is exactly what the worker
// committed (committed + any carried pending token), and the client was sent
// all of it — except after a client cancel, when the client is gone and the
// history also holds the tokens of the round in flight when the worker
// stopped (GetSession's committed says how many). A cancel, an Admin.Abort
// or the drain cut-off asks the worker to stop the burst at its next round
// boundary and reads on to its summary, so the copy stays resident and is
// parked. A burst that ends without its summary (worker died, a stop not
// honoured within the stop grace, deadline) leaves the worker's copy
// uncertain, so that copy is released and the session marked LOST: its next
// turn rebuilds it by prefill of the history. Nothing the client saw is lost.
#ifndef SPECSERVE_SCHEDULER_GENERATE_CALL_H_
#define SPECSERVE_SCHEDULER_GENERATE_CALL_H_

#include <atomic>
#include <string>

#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/specserve.pb.h"
#include "scheduler/admission.h"
#include "scheduler/scheduler_context.h"

namespace specserve::scheduler {

// The client stream of one Generate call, written from the request's own
// thread (a synchronous handler): each delta goes out as soon as it is made,
// with no hand-off to another thread (hand-offs between gRPC threads were most
// of the scheduler's CPU per token). A client that stops reading blocks Write
// once HTTP/2 flow control is exhausted, which holds the worker's burst back
// too (the worker then merges its token messages).
class GenerateWriter {
 public:
  // `stream`: the handler's writer (a ServerWriter, or the ServerSplitStreamer
  // of a handler that reads its request raw).
  GenerateWriter(
      grpc::ServerContext* ctx,
      grpc::internal::WriterInterface<specserve::v1::GenerateEvent>* stream)
      : ctx_(ctx), stream_(stream) {}

  // Sends `event`; false once the client is gone (nothing more is sent).
  bool Write(const specserve::v1::GenerateEvent& event) {
    if (cancelled()) return false;
    if (!stream_->Write(event)) broken_ = true;
    return !broken_;
  }
  // Whether the client cancelled or the stream broke. Any thread.
  bool cancelled() const { return broken_ || ctx_->IsCancelled(); }

 private:
  grpc::ServerContext* const ctx_;
  grpc::internal::WriterInterface<specserve::v1::GenerateEvent>* const stream_;
  std::atomic<bool> broken_{false};
};

// Runs `request` of the caller's `tenant` (its session and request id are
// that tenant's), writing its events to `out`; returns the call's status.
// `inject_nan_at` (tests only, 0 = off): the request's n-th generated token
// gets NaN logits on the worker (kInjectNanAtMetadata).
grpc::Status RunGenerateCall(SchedulerContext* ctx,
                             const specserve::v1::GenerateRequest& request,
                             const std::string& tenant, absl::Time deadline,
                             AdmissionTicket ticket, GenerateWriter* out,
                             uint32_t inject_nan_at = 0);

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_GENERATE_CALL_H_
