#include "worker/spec/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace specserve::spec {

absl::Status ValidateSamplingConfig(const SamplingConfig& c) {
  if (!std::isfinite(c.temperature) || c.temperature < 0.0f) {
    return absl::InvalidArgumentError(
        "sampling.temperature must be finite and >= 0 (0 = greedy)");
  }
  if (c.top_k < 0) {
    return absl::InvalidArgumentError("sampling.top_k must be >= 0 (0 = off)");
  }
  if (!std::isfinite(c.top_p) || c.top_p <= 0.0f || c.top_p > 1.0f) {
    return absl::InvalidArgumentError("sampling.top_p must be in (0, 1]");
  }
  if (!std::isfinite(c.min_p) || c.min_p < 0.0f || c.min_p >= 1.0f) {
    return absl::InvalidArgumentError("sampling.min_p must be in [0, 1)");
  }
  return absl::OkStatus();
}

absl::Status FilteredProbs(const float* logits, int vocab,
                           const SamplingConfig& c, std::vector<float>* probs) {
  probs->assign(vocab, 0.0f);
  float max_logit = -INFINITY;
  for (int i = 0; i < vocab; ++i) {
    if (!std::isfinite(logits[i])) {
      return absl::FailedPreconditionError(
          "non-finite logits: the model produced NaN or inf");
    }
    max_logit = std::max(max_logit, logits[i]);
  }
  // Softmax in double so the filters' cumulative sums do not depend on the
  // float rounding of a long sum.
  std::vector<double> p(vocab);
  double total = 0.0;
  for (int i = 0; i < vocab; ++i) {
    p[i] = std::exp(static_cast<double>(logits[i] - max_logit) / c.temperature);
    total += p[i];
  }
  for (double& x : p) x /= total;

  // Candidates sorted by probability, ties by id (stable, deterministic).
  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return p[a] > p[b]; });
  int keep = vocab;
  if (c.top_k > 0) keep = std::min(keep, c.top_k);
  if (c.top_p < 1.0f) {
    double kept_mass = 0.0;
    for (int i = 0; i < keep; ++i) kept_mass += p[order[i]];
    // Nucleus over the top-k survivors' renormalized mass: keep the smallest
    // prefix whose mass reaches top_p (at least one token).
    double cum = 0.0;
    int n = 0;
    while (n < keep) {
      cum += p[order[n]] / kept_mass;
      ++n;
      if (cum >= c.top_p) break;
    }
    keep = n;
  }
  if (c.min_p > 0.0f) {
    const double threshold = c.min_p * p[order[0]];
    int n = 1;
    while (n < keep && p[order[n]] >= threshold) ++n;
    keep = n;
  }
  double kept = 0.0;
  for (int i = 0; i < keep; ++i) kept += p[order[i]];
  for (int i = 0; i < keep; ++i) {
    (*probs)[order[i]] = static_cast<float>(p[order[i]] / kept);
  }
  return absl::OkStatus();
}

int ArgmaxFirst(const float* logits, int vocab) {
  int best = 0;
  for (int i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

int SampleIndex(const std::vector<float>& probs, float u) {
  double total = 0.0;
  for (float x : probs) total += x;
  const double target = static_cast<double>(u) * total;
  double cum = 0.0;
  int last_nonzero = -1;
  for (int i = 0; i < static_cast<int>(probs.size()); ++i) {
    if (probs[i] <= 0.0f) continue;
    last_nonzero = i;
    cum += probs[i];
    if (target < cum) return i;
  }
  return last_nonzero;  // rounding at the top end
}

}  // namespace specserve::spec
