#include "worker/spec/spec_accept.h"

#include "glog/logging.h"
#include "kernels/sampling/philox.h"

namespace specserve::spec {

RoundOutcome AcceptRound(absl::Span<const int> drafts,
                         absl::Span<const int> target) {
  CHECK_EQ(target.size(), drafts.size() + 1)
      << "a verify of k drafts has k+1 columns";
  RoundOutcome out;
  while (out.accepted < static_cast<int>(drafts.size()) &&
         drafts[out.accepted] == target[out.accepted]) {
    ++out.accepted;
  }
  out.bonus = target[out.accepted];
  return out;
}

float PositionUniform(uint64_t seed, int64_t pos) {
  CHECK_GE(pos, 0) << "a history index";
  return sampling::Uniform(seed, sampling::RandomStream::kSample,
                           static_cast<uint32_t>(pos));
}

}  // namespace specserve::spec
