// Tests of the speculative-decoding primitives: the accept step (greedy and
// sampled, the latter checked for exactness in distribution) and telemetry
// deltas. (The sampling filters' tests are in kernels/sampling.)
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/sample_rows.h"
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
      const RoundOutcome r = AcceptSampled(drafts, p, q, seed, &ctr);
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
  const RoundOutcome ra = AcceptSampled({1, 2, 3}, p, q, 77, &a);
  const RoundOutcome rb = AcceptSampled({1, 2, 3}, p, q, 77, &b);
  EXPECT_EQ(ra.accepted, rb.accepted);
  EXPECT_EQ(ra.bonus, rb.bonus);
  EXPECT_EQ(a.sctr, b.sctr);
  EXPECT_EQ(a.uctr, b.uctr);
}

// On-demand targets: only columns 0..n are made, in order, and the outcome
// and counters equal those of the all-columns form; a target error stops
// the round.
TEST(Accept, OnDemandTargetsAskOnlyTheColumnsReached) {
  std::mt19937 rng(13);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::vector<float>> p, q;
    for (int j = 0; j <= 3; ++j) p.push_back(RandomDist(&rng, 6, 1.0));
    for (int i = 0; i < 3; ++i) q.push_back(RandomDist(&rng, 6, 1.0));
    const std::vector<int> drafts = {static_cast<int>(rng() % 6), static_cast<int>(rng() % 6),
                                     static_cast<int>(rng() % 6)};
    RandomCounters a{1, 2}, b{1, 2};
    const RoundOutcome all = AcceptSampled(drafts, p, q, 99 + trial, &a);
    std::vector<int> asked;
    const absl::StatusOr<RoundOutcome> lazy = AcceptSampled(
        drafts,
        [&](int j) -> absl::StatusOr<const std::vector<float>*> {
          asked.push_back(j);
          return &p[j];
        },
        q, 99 + trial, &b);
    ASSERT_TRUE(lazy.ok());
    EXPECT_EQ(lazy->accepted, all.accepted);
    EXPECT_EQ(lazy->bonus, all.bonus);
    EXPECT_EQ(a.sctr, b.sctr);
    EXPECT_EQ(a.uctr, b.uctr);
    std::vector<int> want(all.accepted + 1);
    for (int j = 0; j <= all.accepted; ++j) want[j] = j;
    EXPECT_EQ(asked, want);
  }
  RandomCounters c;
  const absl::StatusOr<RoundOutcome> failed = AcceptSampled(
      {0}, [](int) -> absl::StatusOr<const std::vector<float>*> {
        return absl::UnavailableError("copy failed");
      },
      {{1.0f}}, 1, &c);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
}

// The backend's accept step (kernels/sample_rows.h AcceptRound, here the
// default on the CPU backend) with AdvanceSampledCounters is AcceptSampled:
// the same outcome and counters, rejections and full accepts alike.
TEST(Accept, BackendAcceptRoundIsAcceptSampled) {
  std::mt19937 rng(21);
  kernels::cpu::CpuBackend be;
  int rejected = 0, full = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int k = 1 + trial % 4, v = 7;
    std::vector<std::vector<float>> p, q;
    // Close p and q accept often; independent ones reject often.
    for (int j = 0; j <= k; ++j) p.push_back(RandomDist(&rng, v, trial % 2 ? 5.0 : 0.5));
    for (int i = 0; i < k; ++i) {
      q.push_back(trial % 2 ? p[i] : RandomDist(&rng, v, 0.5));
    }
    std::vector<int> drafts;
    std::vector<int32_t> drafts32;
    for (int i = 0; i < k; ++i) {
      drafts.push_back(static_cast<int>(rng() % v));
      drafts32.push_back(drafts.back());
    }
    const uint64_t seed = 5000 + trial;
    RandomCounters host{static_cast<uint32_t>(trial), static_cast<uint32_t>(2 * trial)}, dev = host;
    const RoundOutcome want = AcceptSampled(drafts, p, q, seed, &host);
    std::vector<float> pf, qf;
    for (const auto& r : p) pf.insert(pf.end(), r.begin(), r.end());
    for (const auto& r : q) qf.insert(qf.end(), r.begin(), r.end());
    kernels::AcceptRoundParams a;
    a.cols = v;
    a.k = k;
    a.drafts = drafts32.data();
    a.p = pf.data();
    a.p_stride = v;
    a.q = qf.data();
    a.q_stride = v;
    a.seed = seed;
    a.uctr = dev.uctr;
    a.sctr = dev.sctr;
    int32_t n = -1, bonus = -1;
    a.accepted = &n;
    a.bonus = &bonus;
    ASSERT_TRUE(be.AcceptRound(a).ok());
    AdvanceSampledCounters(k, n, &dev);
    EXPECT_EQ(n, want.accepted) << trial;
    EXPECT_EQ(bonus, want.bonus) << trial;
    EXPECT_EQ(dev.uctr, host.uctr) << trial;
    EXPECT_EQ(dev.sctr, host.sctr) << trial;
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
