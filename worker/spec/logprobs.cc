#include "worker/spec/logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "glog/logging.h"

namespace specserve::spec {

TokenLogprobs ComputeLogprobs(absl::Span<const float> logits, float temperature,
                              int32_t id, int top_n) {
  const int V = static_cast<int>(logits.size());
  CHECK_GT(V, 0) << "logprobs of an empty row";
  CHECK(id >= 0 && id < V) << "token " << id << " outside a row of " << V;
  CHECK(top_n >= 0 && top_n <= kMaxTopLogprobs) << "top_n " << top_n;
  const double t = temperature > 0.0f ? static_cast<double>(temperature) : 1.0;
  double max_z = -INFINITY;
  for (float x : logits) max_z = std::max(max_z, static_cast<double>(x) / t);
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) / t - max_z);
  const double log_z = max_z + std::log(sum);
  auto logprob = [&](int i) {
    return static_cast<float>(static_cast<double>(logits[i]) / t - log_z);
  };
  TokenLogprobs out;
  out.id = id;
  out.logprob = logprob(id);
  const int n = std::min(top_n, V);
  if (n == 0) return out;
  // Ranked on the reported (float) values, so the order is the one a
  // client sees, with equal values ordered by id.
  std::vector<float> lp(V);
  for (int i = 0; i < V; ++i) lp[i] = logprob(i);
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + n, order.end(),
                    [&](int32_t a, int32_t b) {
                      return lp[a] > lp[b] || (lp[a] == lp[b] && a < b);
                    });
  out.top_ids.assign(order.begin(), order.begin() + n);
  for (int32_t i : out.top_ids) out.top_logprobs.push_back(lp[i]);
  return out;
}

}  // namespace specserve::spec
