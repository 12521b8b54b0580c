// Tests of the speculative-decoding primitives: the accept step (greedy, and
// sampled as the engine runs it: the backend's AcceptRound and the
// counters, checked for exactness in distribution) and telemetry deltas. (The sampling filters' tests are in kernels/sampling.)
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/sample_rows.h"
#include "kernels/sampling/philox.h"
#include "kernels/sampling/sampling.h"
#include "telemetry/spec_telemetry.h"
#include "worker/spec/spec_accept.h"

namespace specserve::spec {
namespace {

using telemetry::SpecTelemetry;

TEST(Accept, GreedyTakesTheLongestMatchingPrefix) {
  EXPECT_EQ(AcceptGreedy({5, 6, 7}, {5, 6, 9, 1}).accepted, 2);
  EXPECT_EQ(AcceptGreedy({5, 6, 7}, {5, 6, 9, 1}).bonus, 9);
  EXPECT_EQ(AcceptGreedy({5, 6, 7}, {5, 6, 7, 1}).accepted, 3);
  EXPECT_EQ(AcceptGreedy({5, 6, 7}, {5, 6, 7, 1}).bonus, 1);
  EXPECT_EQ(AcceptGreedy({5}, {4, 1}).accepted, 0);
  EXPECT_EQ(AcceptGreedy({5}, {4, 1}).bonus, 4);
}

std::vector<float> RandomDist(std::mt19937* rng, int v, double sharpness) {
  std::gamma_distribution<double> g(sharpness, 1.0);
  std::vector<float> p(v);
  double s = 0;
  for (auto& x : p) s += (x = static_cast<float>(g(*rng)));
  for (auto& x : p) x = static_cast<float>(x / s);
  return p;
}

// Chi-square critical value at significance 0.01 (Wilson–Hilferty).
double ChiSquareCritical01(int dof) {
  const double z = 2.3263478740408408;  // 99th percentile of N(0,1)
  const double a = 2.0 / (9.0 * dof);
  return dof * std::pow(1.0 - a + z * std::sqrt(a), 3);
}

// A sampled round's accept step as the engine runs it: the backend op
// (kernels/sample_rows.h AcceptRound, here the CPU backend's, the
// definition the CUDA kernel is tested against), then the counters.
RoundOutcome AcceptRound(const std::vector<int>& drafts, const std::vector<std::vector<float>>& p,
                         const std::vector<std::vector<float>>& q, uint64_t seed,
                         RandomCounters* counters) {
  static kernels::cpu::CpuBackend* const be = new kernels::cpu::CpuBackend();
  const int k = static_cast<int>(drafts.size()), v = static_cast<int>(p[0].size());
  const std::vector<int32_t> d(drafts.begin(), drafts.end());
  std::vector<float> pf, qf;
  for (const auto& r : p) pf.insert(pf.end(), r.begin(), r.end());
  for (const auto& r : q) qf.insert(qf.end(), r.begin(), r.end());
  kernels::AcceptRoundParams a;
  a.cols = v;
  a.k = k;
  a.drafts = d.data();
  a.p = pf.data();
  a.p_stride = v;
  a.q = qf.data();
  a.q_stride = v;
  a.seed = seed;
  a.uctr = counters->uctr;
  a.sctr = counters->sctr;
  int32_t n = -1, bonus = -1;
  a.accepted = &n;
  a.bonus = &bonus;
  EXPECT_TRUE(be->AcceptRound(a).ok());
  AdvanceSampledCounters(k, n, counters);
  return RoundOutcome{n, bonus};
}

// The first token a sampled round emits must be distributed as p[0], and the
// second (given full acceptance of the first) as p[1] — whatever q is.
TEST(Accept, SampledRoundEmitsTheTargetDistribution) {
  constexpr int kVocab = 6;
  constexpr int kTrials = 40000;
  std::mt19937 rng(7);
  for (int scenario = 0; scenario < 3; ++scenario) {
    const int k = 2;
    std::vector<std::vector<float>> p, q;
    for (int j = 0; j <= k; ++j) p.push_back(RandomDist(&rng, kVocab, 0.7));
    for (int i = 0; i < k; ++i) q.push_back(RandomDist(&rng, kVocab, 0.7));
    std::vector<double> counts(kVocab, 0.0);
    RandomCounters ctr;
    const uint64_t seed = 1000 + scenario;
    for (int t = 0; t < kTrials; ++t) {
      // Drafts are drawn from q with the same counters, as the engine does.
      std::vector<int> drafts;
      for (int i = 0; i < k; ++i) drafts.push_back(DrawToken(q[i], seed, &ctr));
      const RoundOutcome r = AcceptRound(drafts, p, q, seed, &ctr);
      const int first = r.accepted > 0 ? drafts[0] : r.bonus;
      counts[first] += 1;
    }
    double chi2 = 0.0;
    int dof = -1;
    for (int t = 0; t < kVocab; ++t) {
      const double expected = kTrials * p[0][t];
      if (expected < 5) continue;
      chi2 += (counts[t] - expected) * (counts[t] - expected) / expected;
      ++dof;
    }
    EXPECT_LT(chi2, ChiSquareCritical01(dof)) << "scenario " << scenario;
  }
}

TEST(Accept, SameSeedAndCountersReproduce) {
  std::mt19937 rng(3);
  std::vector<std::vector<float>> p, q;
  for (int j = 0; j <= 3; ++j) p.push_back(RandomDist(&rng, 9, 1.0));
  for (int i = 0; i < 3; ++i) q.push_back(RandomDist(&rng, 9, 1.0));
  RandomCounters a{5, 9}, b{5, 9};
  const RoundOutcome ra = AcceptRound({1, 2, 3}, p, q, 77, &a);
  const RoundOutcome rb = AcceptRound({1, 2, 3}, p, q, 77, &b);
  EXPECT_EQ(ra.accepted, rb.accepted);
  EXPECT_EQ(ra.bonus, rb.bonus);
  EXPECT_EQ(a.sctr, b.sctr);
  EXPECT_EQ(a.uctr, b.uctr);
}

// The step's definition, spelled out: draft i is accepted while
// u_i·q_i(d_i) < p_i(d_i) with u_i the kAccept uniform at uctr + i; the bonus
// is the kSample draw at sctr from the residual max(0, p_n − q_n) (where it
// has mass, else p_n) after a rejection at n, from p_k after k acceptances;
// uctr moves by the tests made, sctr by one. Rejections and full accepts.
TEST(Accept, SampledRoundFollowsItsDefinition) {
  std::mt19937 rng(21);
  int rejected = 0, full = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int k = 1 + trial % 4, v = 7;
    std::vector<std::vector<float>> p, q;
    // Equal p and q accept every draft with p > 0; independent ones reject often.
    for (int j = 0; j <= k; ++j) p.push_back(RandomDist(&rng, v, trial % 2 ? 5.0 : 0.5));
    for (int i = 0; i < k; ++i) q.push_back(trial % 2 ? p[i] : RandomDist(&rng, v, 0.5));
    std::vector<int> drafts;
    for (int i = 0; i < k; ++i) drafts.push_back(static_cast<int>(rng() % v));
    const uint64_t seed = 5000 + trial;
    const RandomCounters before{static_cast<uint32_t>(trial), static_cast<uint32_t>(2 * trial)};
    RandomCounters after = before;
    const RoundOutcome got = AcceptRound(drafts, p, q, seed, &after);
    int n = 0;
    while (n < k && sampling::Uniform(seed, sampling::RandomStream::kAccept, before.uctr + n) *
                            q[n][drafts[n]] <
                        p[n][drafts[n]]) {
      ++n;
    }
    const float u = sampling::Uniform(seed, sampling::RandomStream::kSample, before.sctr);
    const int bonus = n < k ? sampling::SampleResidual(p[n], q[n], u) : sampling::SampleIndex(p[k], u);
    EXPECT_EQ(got.accepted, n) << trial;
    EXPECT_EQ(got.bonus, bonus) << trial;
    EXPECT_EQ(after.uctr, before.uctr + (n < k ? n + 1 : k)) << trial;
    EXPECT_EQ(after.sctr, before.sctr + 1) << trial;
    (n < k ? rejected : full) += 1;
  }
  EXPECT_GT(rejected, 50);
  EXPECT_GT(full, 50);
}

TEST(Telemetry, DeltasSumToTotals) {
  SpecTelemetry t;
  t.RecordRound(3, 2);
  const SpecTelemetry snapshot = t;
  t.RecordRound(4, 4);
  t.RecordRound(2, 0);
  const SpecTelemetry d = t.DeltaSince(snapshot);
  EXPECT_EQ(d.rounds, 2u);
  EXPECT_EQ(d.drafted, 6u);
  EXPECT_EQ(d.accepted, 4u);
  EXPECT_EQ(snapshot.accepted + d.accepted, t.accepted);
  ASSERT_EQ(d.drafted_per_position.size(), 4u);
  EXPECT_EQ(d.drafted_per_position[0], 2u);
  EXPECT_EQ(d.accepted_per_position[3], 1u);
  EXPECT_EQ(d.accepted_per_position[0] + snapshot.accepted_per_position[0],
            t.accepted_per_position[0]);
}

}  // namespace
}  // namespace specserve::spec
