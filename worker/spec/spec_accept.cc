#include "worker/spec/spec_accept.h"

#include <algorithm>

#include "glog/logging.h"
#include "kernels/sampling/philox.h"
#include "kernels/sampling/sampling.h"

namespace specserve::spec {

using sampling::RandomStream;
using sampling::SampleIndex;
using sampling::Uniform;

RoundOutcome AcceptGreedy(absl::Span<const int> drafts,
                          absl::Span<const int> target_argmax) {
  CHECK_EQ(target_argmax.size(), drafts.size() + 1)
      << "a verify of k drafts has k+1 columns";
  RoundOutcome out;
  while (out.accepted < static_cast<int>(drafts.size()) &&
         drafts[out.accepted] == target_argmax[out.accepted]) {
    ++out.accepted;
  }
  out.bonus = target_argmax[out.accepted];
  return out;
}

int DrawToken(const std::vector<float>& probs, uint64_t seed,
              RandomCounters* counters) {
  const float u = Uniform(seed, RandomStream::kSample, counters->sctr++);
  return SampleIndex(probs, u);
}

absl::StatusOr<RoundOutcome> AcceptSampled(absl::Span<const int> drafts,
                                           const TargetProbs& target,
                                           const std::vector<std::vector<float>>& q,
                                           uint64_t seed, RandomCounters* counters) {
  const int k = static_cast<int>(drafts.size());
  CHECK_EQ(static_cast<int>(q.size()), k);
  RoundOutcome out;
  for (int i = 0; i < k; ++i) {
    const int d = drafts[i];
    absl::StatusOr<const std::vector<float>*> pi = target(i);
    if (!pi.ok()) return pi.status();
    const std::vector<float>& p = **pi;
    const float u = Uniform(seed, RandomStream::kAccept, counters->uctr++);
    if (u * q[i][d] < p[d]) {
      ++out.accepted;
      continue;
    }
    // Rejected: the residual max(0, p - q) carries exactly the probability
    // mass the draft under-proposed.
    std::vector<float> residual(p.size());
    double mass = 0.0;
    for (size_t t = 0; t < residual.size(); ++t) {
      residual[t] = std::max(0.0f, p[t] - q[i][t]);
      mass += residual[t];
    }
    // p == q up to rounding leaves no residual mass; p itself is then the
    // right distribution.
    out.bonus = DrawToken(mass > 0.0 ? residual : p, seed, counters);
    return out;
  }
  absl::StatusOr<const std::vector<float>*> pk = target(k);
  if (!pk.ok()) return pk.status();
  out.bonus = DrawToken(**pk, seed, counters);
  return out;
}

RoundOutcome AcceptSampled(absl::Span<const int> drafts,
                           const std::vector<std::vector<float>>& p,
                           const std::vector<std::vector<float>>& q,
                           uint64_t seed, RandomCounters* counters) {
  CHECK_EQ(p.size(), drafts.size() + 1);
  return *AcceptSampled(
      drafts, [&](int j) -> absl::StatusOr<const std::vector<float>*> { return &p[j]; }, q,
      seed, counters);
}

}  // namespace specserve::spec
