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

absl::StatusOr<RoundOutcome> AcceptSampled(absl::Span<const int> drafts,
                                           RoundDistributions& dists, uint64_t seed,
                                           RandomCounters* counters) {
  const int k = static_cast<int>(drafts.size());
  RoundOutcome out;
  for (int i = 0; i < k; ++i) {
    const int d = drafts[i];
    SS_ASSIGN_OR_RETURN(const float p, dists.Target(i, d));
    SS_ASSIGN_OR_RETURN(const float q, dists.Draft(i, d));
    const float u = Uniform(seed, RandomStream::kAccept, counters->uctr++);
    if (u * q < p) {
      ++out.accepted;
      continue;
    }
    // Rejected: the residual max(0, p - q) carries exactly the probability
    // mass the draft under-proposed.
    SS_ASSIGN_OR_RETURN(out.bonus, SampleEvent(seed, counters, [&](float u) {
                          return dists.DrawResidual(i, u);
                        }));
    return out;
  }
  SS_ASSIGN_OR_RETURN(out.bonus, SampleEvent(seed, counters,
                                             [&](float u) { return dists.DrawTarget(k, u); }));
  return out;
}

void AdvanceSampledCounters(int k, int n, RandomCounters* counters) {
  CHECK(n >= 0 && n <= k) << "accepted " << n << " of " << k;
  counters->uctr += n < k ? n + 1 : k;
  ++counters->sctr;
}

namespace {

// Host vectors: q given, p made on demand by `target`.
class HostDistributions : public RoundDistributions {
 public:
  HostDistributions(const TargetProbs& target, const std::vector<std::vector<float>>& q)
      : target_(target), q_(q) {}

  absl::StatusOr<float> Target(int column, int token) override {
    SS_ASSIGN_OR_RETURN(const std::vector<float>* p, Column(column));
    return (*p)[token];
  }
  absl::StatusOr<float> Draft(int i, int token) override { return q_[i][token]; }
  absl::StatusOr<int> DrawResidual(int i, float u) override {
    SS_ASSIGN_OR_RETURN(const std::vector<float>* p, Column(i));
    return SampleResidual(*p, q_[i], u);
  }
  absl::StatusOr<int> DrawTarget(int column, float u) override {
    SS_ASSIGN_OR_RETURN(const std::vector<float>* p, Column(column));
    return SampleIndex(*p, u);
  }

 private:
  // Each column is asked of `target` once, in order.
  absl::StatusOr<const std::vector<float>*> Column(int column) {
    if (column != column_) {
      SS_ASSIGN_OR_RETURN(p_, target_(column));
      column_ = column;
    }
    return p_;
  }

  const TargetProbs& target_;
  const std::vector<std::vector<float>>& q_;
  int column_ = -1;
  const std::vector<float>* p_ = nullptr;
};

}  // namespace

absl::StatusOr<RoundOutcome> AcceptSampled(absl::Span<const int> drafts,
                                           const TargetProbs& target,
                                           const std::vector<std::vector<float>>& q,
                                           uint64_t seed, RandomCounters* counters) {
  CHECK_EQ(static_cast<int>(q.size()), static_cast<int>(drafts.size()));
  HostDistributions dists(target, q);
  return AcceptSampled(drafts, dists, seed, counters);
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
