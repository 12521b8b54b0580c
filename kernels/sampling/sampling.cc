#include "kernels/sampling/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace specserve::sampling {

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

namespace {

// Token ids in the filters' order (probability descending, ties by id
// ascending: a strict total order, so every prefix is unique), sorted only
// as far as asked: [0, sorted) is the sorted prefix, the rest is unordered.
// Extending to m costs O((V - sorted) log(m - sorted)) or, for large
// steps, O(V - sorted + m log m).
class SortedPrefix {
 public:
  // Up to this many more ids, a heap select beats nth_element's passes.
  static constexpr int kHeapSelect = 4096;

  explicit SortedPrefix(const std::vector<double>& p)
      : p_(p), order_(p.size()) {
    std::iota(order_.begin(), order_.end(), 0);
  }
  void Extend(int m) {
    m = std::min(m, static_cast<int>(order_.size()));
    if (m <= sorted_) return;
    auto before = [this](int a, int b) {
      return p_[a] > p_[b] || (p_[a] == p_[b] && a < b);
    };
    if (m - sorted_ <= kHeapSelect) {
      // A few more: a heap of them rejects most of the rest in one compare.
      std::partial_sort(order_.begin() + sorted_, order_.begin() + m,
                        order_.end(), before);
    } else {
      std::nth_element(order_.begin() + sorted_, order_.begin() + m - 1,
                       order_.end(), before);
      std::sort(order_.begin() + sorted_, order_.begin() + m, before);
    }
    sorted_ = m;
  }
  int sorted() const { return sorted_; }
  int operator[](int i) const { return order_[i]; }

 private:
  const std::vector<double>& p_;
  std::vector<int> order_;
  int sorted_ = 0;
};

}  // namespace

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
  const std::vector<double> p =
      TemperatureSoftmax(logits, vocab, max_logit, c.temperature);

  const bool top_k = c.top_k > 0 && c.top_k < vocab;
  const bool top_p = c.top_p < 1.0f;
  if (!top_k && !top_p) {
    // Every token, or those within min_p of the most likely one: a set that
    // needs no order (the most likely token always stays).
    const double threshold =
        c.min_p > 0.0f ? c.min_p * *std::max_element(p.begin(), p.end()) : 0.0;
    double kept = 0.0;
    for (int i = 0; i < vocab; ++i) {
      if (p[i] >= threshold) kept += p[i];
    }
    for (int i = 0; i < vocab; ++i) {
      if (p[i] >= threshold) (*probs)[i] = static_cast<float>(p[i] / kept);
    }
    return absl::OkStatus();
  }

  // The survivors are a prefix of the filters' order; sort only as much of
  // it as the filters read, growing the prefix until the nucleus is
  // complete (a flat distribution may still need most of the vocabulary).
  const int limit = top_k ? c.top_k : vocab;
  SortedPrefix order(p);
  // (top-k needs its whole prefix for the nucleus' mass.)
  order.Extend(top_p && !top_k ? std::min(limit, 256) : limit);
  int keep = limit;
  if (top_p) {
    // Nucleus over the top-k survivors' renormalized mass (all of it without
    // top-k: 1 up to rounding): keep the smallest prefix whose mass reaches
    // top_p (at least one token).
    double kept_mass = 1.0;
    if (top_k) {
      kept_mass = 0.0;
      for (int i = 0; i < limit; ++i) kept_mass += p[order[i]];
    }
    double cum = 0.0;
    int n = 0;
    while (n < limit) {
      if (n == order.sorted()) {  // the sorted prefix ran out: 4x, or all of it
        order.Extend(4 * n >= vocab / 4 ? vocab : 4 * n);
      }
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

std::vector<double> TemperatureSoftmax(const float* logits, int vocab,
                                       float max_logit, float temperature) {
  // In double so the filters' cumulative sums do not depend on the float
  // rounding of a long sum.
  std::vector<double> p(vocab);
  double total = 0.0;
  for (int i = 0; i < vocab; ++i) {
    p[i] = std::exp(static_cast<double>(logits[i] - max_logit) / temperature);
    total += p[i];
  }
  for (double& x : p) x /= total;
  return p;
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

}  // namespace specserve::sampling
