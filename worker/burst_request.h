// What a worker makes of a BurstRequest before it touches the session: the
// checks that refuse it (INVALID_ARGUMENT) and the engine parameters it
// becomes; and the same for an AdmitRequest's draft depth. One place for
// WorkerService and tools/fuzz's burst target, so the fuzzer runs the
// worker's own code.
#ifndef SPECSERVE_WORKER_BURST_REQUEST_H_
#define SPECSERVE_WORKER_BURST_REQUEST_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/api_limits.h"
#include "proto/worker.pb.h"
#include "worker/grammar/grammar.h"
#include "worker/spec/spec_engine.h"

namespace specserve::worker {

// max_new in 1..INT32_MAX (the engine counts in int), max_emit (when set)
// in max_new..INT32_MAX, k at most
// kMaxDraftDepth (proto/api_limits.h: the deepest round any session is sized
// for), logprobs and prompt_logprobs (when set) at most
// spec::kMaxTopLogprobs.
absl::Status CheckBurstLimits(const specserve::worker::v1::BurstRequest& r);

// draft_depth at most kMaxDraftDepth (0 = kMaxDraftDepth).
absl::Status CheckAdmitLimits(const specserve::worker::v1::AdmitRequest& r);

// The draft depth a session admitted by `r` (which passed CheckAdmitLimits)
// is sized for: 1..kMaxDraftDepth.
int DraftDepthOf(const specserve::worker::v1::AdmitRequest& r);

// The engine's parameters for `r` (which passed CheckBurstLimits), its
// sampling validated (top_p 0 = unset = 1). `fault_injection`: honour
// inject_nan_at (--enable_fault_injection). A structured_output is compiled
// by `grammars` (cached there): INVALID_ARGUMENT naming the field with the
// parser's message when it does not compile or has no kind; UNIMPLEMENTED
// when `grammars` is null (the model has no tokenizer.json).
absl::StatusOr<spec::BurstParams> BurstParamsOf(
    const specserve::worker::v1::BurstRequest& r, bool fault_injection,
    grammar::GrammarCompiler* grammars);

// The grammar spec of a request's structured_output; INVALID_ARGUMENT when
// it has no kind.
absl::StatusOr<grammar::GrammarSpec> GrammarSpecOf(
    const specserve::v1::StructuredOutput& s);

}  // namespace specserve::worker

#endif  // SPECSERVE_WORKER_BURST_REQUEST_H_
