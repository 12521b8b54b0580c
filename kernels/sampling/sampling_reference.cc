#include "kernels/sampling/sampling_reference.h"

#include <algorithm>
#include <numeric>

namespace specserve::sampling {

std::vector<double> FilteredProbsByFullSort(const std::vector<float>& logits,
                                            const SamplingConfig& c) {
  const int V = static_cast<int>(logits.size());
  const std::vector<double> p = TemperatureSoftmax(
      logits.data(), V, *std::max_element(logits.begin(), logits.end()),
      c.temperature);
  std::vector<int> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return p[a] > p[b]; });
  int keep = c.top_k > 0 ? std::min(V, c.top_k) : V;
  double mass = 0.0;
  for (int i = 0; i < keep; ++i) mass += p[order[i]];
  if (c.top_p < 1.0f) {
    double cum = 0.0;
    int n = 0;
    while (n < keep) {
      cum += p[order[n++]] / mass;
      if (cum >= c.top_p) break;
    }
    keep = n;
  }
  if (c.min_p > 0.0f) {
    int n = 1;
    while (n < keep && p[order[n]] >= c.min_p * p[order[0]]) ++n;
    keep = n;
  }
  std::vector<double> out(V, 0.0);
  double kept = 0.0;
  for (int i = 0; i < keep; ++i) kept += p[order[i]];
  for (int i = 0; i < keep; ++i) out[order[i]] = p[order[i]] / kept;
  return out;
}

}  // namespace specserve::sampling
