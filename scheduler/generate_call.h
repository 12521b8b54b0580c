// One Generate request, run to completion on its own thread: admission wait,
// tokenization, the session turn (create / append / continue / rewind),
// placement and rebuild of lost sessions, the spec gate, bursts on the worker,
// stop tokens and strings, the final event, parking.
//
// Consistency rule: the session table's history is exactly what the client
// was sent (committed + any carried pending token). A burst that ends without
// its summary (worker died, call cancelled, deadline) leaves the worker's copy
// uncertain, so that copy is released and the session marked LOST: its next
// turn rebuilds it by prefill of the history. Nothing the client saw is lost.
#ifndef SPECSERVE_SCHEDULER_GENERATE_CALL_H_
#define SPECSERVE_SCHEDULER_GENERATE_CALL_H_

#include <atomic>

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
  GenerateWriter(grpc::ServerContext* ctx,
                 grpc::ServerWriter<specserve::v1::GenerateEvent>* stream)
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
  grpc::ServerWriter<specserve::v1::GenerateEvent>* const stream_;
  std::atomic<bool> broken_{false};
};

// Runs `request`, writing its events to `out`; returns the call's status.
// `inject_nan_at` (tests only, 0 = off): the request's n-th generated token
// gets NaN logits on the worker (kInjectNanAtMetadata).
grpc::Status RunGenerateCall(SchedulerContext* ctx,
                             const specserve::v1::GenerateRequest& request,
                             absl::Time deadline, AdmissionTicket ticket,
                             GenerateWriter* out, uint32_t inject_nan_at = 0);

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_GENERATE_CALL_H_
