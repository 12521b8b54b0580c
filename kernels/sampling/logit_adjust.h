// vLLM's logit controls, applied to one row of logits before the sampling
// filters (sampling.h) pick a token from it: min_tokens, logit_bias and the
// repetition, frequency and presence penalties. Order and formulas are
// vLLM's: stop tokens are masked (-inf) while the output is shorter than
// min_tokens, the biases are added, then the repetition penalty scales every
// token seen in the prompt or the output (positive logits divided by it,
// the others multiplied), then each output token loses frequency_penalty ×
// its count and presence_penalty once.
//
// A row's adjustments depend only on the tokens before its position
// (TokenCounts), so the row that chooses the token at history index p gets
// the same adjustment wherever it comes from: a plain decode step, a verify
// column (whose prefix includes the drafts before it) or a burst's first
// token. The worker's engine (worker/spec) applies them on the host and
// picks with ChooseToken, plain and speculative alike, so adjusted output
// keeps the exactness of unadjusted output (docs/DESIGN.md §3).
#ifndef SPECSERVE_KERNELS_SAMPLING_LOGIT_ADJUST_H_
#define SPECSERVE_KERNELS_SAMPLING_LOGIT_ADJUST_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/sampling/sampling.h"

namespace specserve::sampling {

// vLLM's bounds: presence and frequency penalties in [-2, 2], a repetition
// penalty > 0 (1 = off), biases in [-100, 100] (OpenAI's range; -100
// makes a token all but impossible) on at most kMaxLogitBias tokens.
inline constexpr float kMaxAbsPenalty = 2.0f;
inline constexpr float kMaxAbsLogitBias = 100.0f;
inline constexpr int kMaxLogitBias = 1024;

struct LogitAdjustments {
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  // (token id, bias), ids distinct.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // While the output holds fewer than min_tokens tokens, `stop_ids` (EOS
  // unless ignored, and the request's stop token ids) cannot be chosen.
  int min_tokens = 0;
  std::vector<int32_t> stop_ids;

  // Whether a penalty reads the token counts.
  bool penalizes() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f ||
           repetition_penalty != 1.0f;
  }
  bool masks() const { return min_tokens > 0 && !stop_ids.empty(); }
  // Whether any row can change: otherwise the logits are used as they are.
  bool active() const { return penalizes() || !logit_bias.empty() || masks(); }
};

// INVALID_ARGUMENT naming the field (sampling.presence_penalty, ...,
// sampling.logit_bias, stopping.min_tokens) for values outside the bounds
// above, non-finite values, ids outside [0, vocab) or repeated.
absl::Status ValidateLogitAdjustments(const LogitAdjustments& a, int vocab);

// The tokens before a position, as the penalties read them: the prompt
// (the history before the request's output) and the output so far. Grows
// and shrinks at the end (drafts are tried and taken back).
class TokenCounts {
 public:
  // history[0, output_start) is the prompt, the rest output. `count`
  // false keeps only the lengths (no penalty reads the counts).
  TokenCounts(absl::Span<const int32_t> history, int64_t output_start,
              bool count);

  // Appends an output token.
  void Push(int32_t token);
  // Drops output tokens from the end until length() == `length`, which
  // must lie in [prompt length, length()].
  void PopTo(int64_t length);

  // History index of the next token.
  int64_t length() const {
    return prompt_len_ + static_cast<int64_t>(output_.size());
  }
  int64_t output_len() const { return static_cast<int64_t>(output_.size()); }

  const absl::flat_hash_set<int32_t>& prompt_tokens() const { return prompt_; }
  // Each output token's count (present tokens only).
  const absl::flat_hash_map<int32_t, int32_t>& output_counts() const {
    return output_counts_;
  }

 private:
  const int64_t prompt_len_;
  const bool count_;
  std::vector<int32_t> output_;
  absl::flat_hash_set<int32_t> prompt_;
  absl::flat_hash_map<int32_t, int32_t> output_counts_;
};

// Applies `a` in place to `logits` ([vocab]), the row that chooses the
// token at index c.length(). Masked tokens become -inf; every other logit
// that was finite stays finite (a penalty that overflows saturates).
void ApplyLogitAdjustments(const LogitAdjustments& a, const TokenCounts& c,
                           absl::Span<float> logits);

// The token an adjusted row chooses: greedy, its first maximum; sampled,
// the inverse-CDF draw at `uniform` from FilteredProbs of the row, masked
// (-inf) tokens having probability 0. FAILED_PRECONDITION when a logit is
// NaN or +inf, or every token is masked.
absl::StatusOr<int32_t> ChooseToken(absl::Span<const float> adjusted,
                                    const SamplingConfig& config,
                                    float uniform);

}  // namespace specserve::sampling

#endif  // SPECSERVE_KERNELS_SAMPLING_LOGIT_ADJUST_H_
