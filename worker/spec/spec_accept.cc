#include "worker/spec/spec_accept.h"

#include "glog/logging.h"
#include "kernels/sampling/philox.h"
#include "kernels/sampling/sampling.h"
#include "telemetry/status_macros.h"

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

}  // namespace specserve::spec
