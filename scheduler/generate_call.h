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

#include "absl/time/time.h"
#include "proto/specserve.pb.h"
#include "scheduler/admission.h"
#include "scheduler/scheduler_context.h"
#include "telemetry/stream_reactor.h"

namespace specserve::scheduler {

// The client stream. Deltas queued behind an in-flight write are merged (ids
// appended, text concatenated), so a slow client costs fewer messages.
class GenerateWriter final
    : public telemetry::StreamReactor<specserve::v1::GenerateEvent> {
 protected:
  bool Merge(specserve::v1::GenerateEvent* into,
             const specserve::v1::GenerateEvent& next) override {
    if (!into->has_delta() || !next.has_delta()) return false;
    into->mutable_delta()->mutable_ids()->MergeFrom(next.delta().ids());
    into->mutable_delta()->mutable_text()->append(next.delta().text());
    return true;
  }
};

// Runs `request` and finishes `out` (the caller then calls out->Done()).
// `inject_nan_at` (tests only, 0 = off): the request's n-th generated token
// gets NaN logits on the worker (kInjectNanAtMetadata).
void RunGenerateCall(SchedulerContext* ctx,
                     const specserve::v1::GenerateRequest& request,
                     absl::Time deadline, AdmissionTicket ticket,
                     GenerateWriter* out, uint32_t inject_nan_at = 0);

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_GENERATE_CALL_H_
