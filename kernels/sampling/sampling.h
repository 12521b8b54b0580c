// Turning logits into the distribution a sampled request draws from, and
// drawing from it. The same transform is applied to the target (trunk) and the
// draft (MTP) logits: a draft is drawn from the head's filtered distribution
// at the uniform its position's token is drawn at, and accepted when it
// equals the trunk's draw (worker/spec/spec_accept.h).
//
// Order (as vLLM and HF apply them): temperature, then top-k, then top-p
// (nucleus, over the top-k survivors), then min-p; survivors renormalized.
// Ties are broken by token id so the result is deterministic.
#ifndef SPECSERVE_KERNELS_SAMPLING_SAMPLING_H_
#define SPECSERVE_KERNELS_SAMPLING_SAMPLING_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace specserve::sampling {

struct SamplingConfig {
  float temperature = 0.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // (0, 1]; 1 = off
  float min_p = 0.0f;        // [0, 1); 0 = off

  bool greedy() const { return temperature == 0.0f; }
};

// INVALID_ARGUMENT with a message naming the field for NaN/inf/negative
// temperature, top_p outside (0, 1], min_p outside [0, 1), negative top_k.
absl::Status ValidateSamplingConfig(const SamplingConfig& c);

// probs[i] = filtered, renormalized softmax(logits / temperature). Requires
// !c.greedy(). Returns FAILED_PRECONDITION when the logits hold NaN or inf
// (the request must fail rather than sample garbage).
absl::Status FilteredProbs(const float* logits, int vocab,
                           const SamplingConfig& c, std::vector<float>* probs);

// softmax(logits / temperature) in double (finite logits, max_logit their
// maximum): the distribution every filter starts from, shared with the
// full-sort reference so that both filter the same numbers.
std::vector<double> TemperatureSoftmax(const float* logits, int vocab,
                                       float max_logit, float temperature);

// Index of the first maximum (greedy); the tie rule matches the kernels'.
int ArgmaxFirst(const float* logits, int vocab);

// Inverse-CDF draw with uniform u in [0, 1): the smallest i with
// u < sum(probs[0..i]) * ... over the non-zero entries; always returns an
// index with probs[i] > 0.
int SampleIndex(const std::vector<float>& probs, float u);

}  // namespace specserve::sampling

#endif  // SPECSERVE_KERNELS_SAMPLING_SAMPLING_H_
