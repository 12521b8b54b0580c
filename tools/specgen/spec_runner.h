// specgen's engine path: runs one or more turns on one SpecSession through the
// speculative engine (worker/spec/spec_engine.h) in bursts, as a worker would,
// and the plain-greedy oracle that --compare-plain checks it against.
//
//   SpecRunOptions o{.k = 3, .burst = 32, .stop_ids = eos};
//   SS_ASSIGN_OR_RETURN(SpecRun run, RunTurns(model, turns, o));
//   SS_ASSIGN_OR_RETURN(auto plain, PlainGreedyTurns(model, turns, run));
//
// A turn's `emitted` is every token the engine emitted for it: a round may
// overshoot max_new and may run past a stop token before it ends; those
// tokens are committed, so the next turn continues after them. `ids` is what
// the turn reports: the first max_new emitted tokens, cut after the first
// stop token (plain greedy's output for the same request).
#ifndef SPECSERVE_TOOLS_SPECGEN_SPEC_RUNNER_H_
#define SPECSERVE_TOOLS_SPECGEN_SPEC_RUNNER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/sampling/sampling.h"
#include "telemetry/spec_telemetry.h"
#include "worker/model/model.h"
#include "worker/spec/spec_engine.h"

namespace specserve::tools::specgen {

struct Turn {
  std::vector<int32_t> prompt;  // appended to the session; empty = continue
  int max_new = 16;
  bool rewind = false;  // back to the last prompt checkpoint first
};

struct SpecRunOptions {
  int k = 0;       // draft depth; 0 = plain decode steps
  int burst = 32;  // tokens per burst; <= 0 = the whole turn in one burst
  sampling::SamplingConfig sampling;
  uint64_t seed = 0;
  std::vector<int32_t> stop_ids;
  int capacity = 0;  // session rows; 0 = enough for every turn
};

struct TurnResult {
  std::vector<int32_t> emitted;
  std::vector<int32_t> ids;
  spec::BurstEnd end = spec::BurstEnd::kMaxNew;
  int bursts = 0;
  int cached_tokens = 0;  // prompt rows served from the caches
  double seconds = 0;     // bursts of this turn (later turns include prefill)
  telemetry::SpecTelemetry telemetry;  // this turn's rounds
};

struct SpecRun {
  std::vector<TurnResult> turns;
  telemetry::SpecTelemetry telemetry;  // the whole session
  int prefill_tokens = 0;         // the first turn's prompt (admit)
  double prefill_seconds = 0;
};

// Session capacity when SpecRunOptions::capacity is 0.
int AutoCapacity(absl::Span<const Turn> turns, int k);

absl::StatusOr<SpecRun> RunTurns(model::Model* model,
                                 absl::Span<const Turn> turns,
                                 const SpecRunOptions& options);

// For each turn, the plain greedy continuation (Prefill of the same history,
// then Model::Decode one token at a time, no stop tokens) of as many tokens as
// `run` emitted for it; the history follows the same turns, rewinds and
// emitted tokens as the engine's session.
absl::StatusOr<std::vector<std::vector<int32_t>>> PlainGreedyTurns(
    model::Model* model, absl::Span<const Turn> turns, const SpecRun& run);

const char* BurstEndName(spec::BurstEnd end);

}  // namespace specserve::tools::specgen

#endif  // SPECSERVE_TOOLS_SPECGEN_SPEC_RUNNER_H_
