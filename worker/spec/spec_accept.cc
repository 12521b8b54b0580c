#include "worker/spec/spec_accept.h"


#include "glog/logging.h"
#include "telemetry/status_macros.h"
#include "kernels/sampling/philox.h"
#include "kernels/sampling/sampling.h"

namespace specserve::spec {

using sampling::RandomStream;
using sampling::SampleIndex;
using sampling::SampleResidual;
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

absl::StatusOr<int32_t> SampleEvent(uint64_t seed, RandomCounters* counters,
                                    absl::FunctionRef<absl::StatusOr<int32_t>(float u)> draw) {
  SS_ASSIGN_OR_RETURN(const int32_t token,
                      draw(Uniform(seed, RandomStream::kSample, counters->sctr)));
  ++counters->sctr;
  return token;
}

int DrawToken(const std::vector<float>& probs, uint64_t seed,
              RandomCounters* counters) {
  return *SampleEvent(seed, counters, [&](float u) -> absl::StatusOr<int32_t> {
    return SampleIndex(probs, u);
  });
}

void AdvanceSampledCounters(int k, int n, RandomCounters* counters) {
  CHECK(n >= 0 && n <= k) << "accepted " << n << " of " << k;
  counters->uctr += n < k ? n + 1 : k;
  ++counters->sctr;
}

absl::StatusOr<RoundOutcome> AcceptSampled(absl::Span<const int> drafts,
                                           const TargetProbs& target,
                                           const std::vector<std::vector<float>>& q,
                                           uint64_t seed, RandomCounters* counters) {
  CHECK_EQ(static_cast<int>(q.size()), static_cast<int>(drafts.size()));
  const int k = static_cast<int>(drafts.size());
  RoundOutcome out;
  for (int i = 0; i < k; ++i) {
    // (asked before this test's uniform: a target error moves no counter)
    SS_ASSIGN_OR_RETURN(const std::vector<float>* p, target(i));
    const int d = drafts[i];
    const float u = Uniform(seed, RandomStream::kAccept, counters->uctr++);
    if (u * q[i][d] < (*p)[d]) {
      ++out.accepted;
      continue;
    }
    // Rejected: the residual max(0, p - q) carries exactly the probability
    // mass the draft under-proposed.
    SS_ASSIGN_OR_RETURN(out.bonus, SampleEvent(seed, counters,
                                               [&](float u) -> absl::StatusOr<int32_t> {
                                                 return SampleResidual(*p, q[i], u);
                                               }));
    return out;
  }
  SS_ASSIGN_OR_RETURN(const std::vector<float>* p, target(k));
  SS_ASSIGN_OR_RETURN(out.bonus,
                      SampleEvent(seed, counters, [&](float u) -> absl::StatusOr<int32_t> {
                        return SampleIndex(*p, u);
                      }));
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
