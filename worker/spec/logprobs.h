// Log-probabilities of tokens for the API's logprobs options: the chosen
// token's logprob and the top-n alternatives of one row of logits. The
// engine (spec_engine.h) calls it on the host copy of the logits that chose
// each emitted token (plain decode rows, verify columns, the stored last
// logits) and on the prefill rows of a prompt.
//
// Values are log_softmax(logits / T) over the whole vocabulary (T = the
// request's temperature if > 0, else 1), before any top-k/top-p/min-p
// filtering. The result is a pure function of the row's bits and T: since
// verify columns are bit-identical to plain decode rows (docs/DESIGN.md §3),
// speculative and plain decoding report bit-identical logprobs.
#ifndef SPECSERVE_WORKER_SPEC_LOGPROBS_H_
#define SPECSERVE_WORKER_SPEC_LOGPROBS_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace specserve::spec {

// The most alternatives a request may ask for (specserve.v1
// ResponseOptions.logprobs / prompt_logprobs).
constexpr int kMaxTopLogprobs = 20;

struct TokenLogprobs {
  int32_t id = -1;
  float logprob = 0.0f;
  // The min(top_n, V) most likely tokens, by descending logprob, ties by
  // lower id.
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
};

// The logprobs of token `id` under `logits` ([V], finite) at `temperature`
// (<= 0 reads as 1), with the top `top_n` (0..kMaxTopLogprobs)
// alternatives. Sums run in double in index order, so the result is
// deterministic.
TokenLogprobs ComputeLogprobs(absl::Span<const float> logits, float temperature,
                              int32_t id, int top_n);

}  // namespace specserve::spec

#endif  // SPECSERVE_WORKER_SPEC_LOGPROBS_H_
