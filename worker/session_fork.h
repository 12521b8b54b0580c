// A new worker session as an exact copy of another's state at one of its
// reusable positions (the ForkSession RPC, proto/worker.proto): the engine's
// side of automatic prefix reuse (docs/DESIGN.md "Prefix reuse").
//
// Reusable positions of a session: its committed end (a parked session is
// flushed, so its caches, last hidden, logits and next_pred are those of its
// whole history), its prompt checkpoint and its prefix checkpoints (each a
// TurnCheckpoint: the recurrent and conv copies at pos plus the hidden and
// logits of row pos-1; the attention and MTP rows below pos are never
// rewritten). The fork holds
// exactly what an Admit of those tokens would: the same bits, its own
// capacity, its own prompt checkpoint at pos, fresh telemetry.
#ifndef SPECSERVE_WORKER_SESSION_FORK_H_
#define SPECSERVE_WORKER_SESSION_FORK_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/spec/model_executor.h"
#include "worker/spec/spec_session.h"

namespace specserve::worker {

// Session `id` with caches for `capacity` rows holding `src`'s state after
// `prefix`, which must be src's history up to its prompt checkpoint, one of
// its prefix checkpoints or its committed end (FAILED_PRECONDITION otherwise,
// or while src carries a pending token, or when `speculative` asks for draft
// state src lacks); OUT_OF_RANGE when the prefix exceeds `capacity`;
// INVALID_ARGUMENT for an empty prefix. Runs model work through `executor`
// (takes the model lock).
absl::StatusOr<std::unique_ptr<spec::SpecSession>> ForkSession(
    spec::ModelExecutor* executor, const spec::SpecSession& src,
    const std::string& id, int capacity, absl::Span<const uint32_t> prefix,
    bool speculative);

}  // namespace specserve::worker

#endif  // SPECSERVE_WORKER_SESSION_FORK_H_
