// Tests of the speculative-decoding primitives: Philox, sampling filters, the
// accept step (greedy and sampled, the latter checked for exactness in
// distribution), and telemetry deltas.
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "telemetry/spec_telemetry.h"
#include "worker/spec/philox.h"
#include "worker/spec/sampling.h"
#include "worker/spec/sampling_reference.h"
#include "worker/spec/spec_accept.h"

namespace specserve::spec {
namespace {

using telemetry::SpecTelemetry;

TEST(Philox, MatchesPublishedKnownAnswers) {
  // Known-answer vectors of Philox4x32-10 (Random123's kat_vectors).
  EXPECT_EQ(Philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c,
                                     0x9b00dbd8}));
  EXPECT_EQ(Philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
                          {0xffffffff, 0xffffffff}),
            (std::array<uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6,
                                     0x6d5451fd}));
  EXPECT_EQ(Philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
                          {0xa4093822, 0x299f31d0}),
            (std::array<uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420,
                                     0x24126ea1}));
}

TEST(Philox, UniformIsInRangeAndStreamsDiffer) {
  for (uint32_t c = 0; c < 1000; ++c) {
    const float u = Uniform(42, RandomStream::kSample, c);
    EXPECT_GE(u, 0.0f);
    EXPECT_LT(u, 1.0f);
    EXPECT_NE(u, Uniform(42, RandomStream::kAccept, c));
    EXPECT_EQ(u, Uniform(42, RandomStream::kSample, c));  // pure function
  }
}

TEST(Sampling, ValidationNamesTheField) {
  SamplingConfig c;
  c.temperature = NAN;
  EXPECT_NE(ValidateSamplingConfig(c).message().find("temperature"),
            std::string::npos);
  c = SamplingConfig{1.0f, 0, 1.5f, 0.0f};
  EXPECT_NE(ValidateSamplingConfig(c).message().find("top_p"),
            std::string::npos);
  c = SamplingConfig{1.0f, 0, 0.0f, 0.0f};
  EXPECT_FALSE(ValidateSamplingConfig(c).ok());
  c = SamplingConfig{1.0f, -1, 1.0f, 0.0f};
  EXPECT_FALSE(ValidateSamplingConfig(c).ok());
  c = SamplingConfig{INFINITY, 0, 1.0f, 0.0f};
  EXPECT_FALSE(ValidateSamplingConfig(c).ok());
  c = SamplingConfig{0.7f, 5, 0.9f, 0.05f};
  EXPECT_TRUE(ValidateSamplingConfig(c).ok());
}

TEST(Sampling, FiltersKeepTheRightTokens) {
  const std::vector<float> logits = {3.0f, 1.0f, 2.0f, 0.0f, 2.0f};
  std::vector<float> p;
  ASSERT_TRUE(FilteredProbs(logits.data(), 5, {1.0f, 2, 1.0f, 0.0f}, &p).ok());
  // top-2: token 0 and the first of the tied pair (id 2).
  EXPECT_GT(p[0], 0);
  EXPECT_GT(p[2], 0);
  EXPECT_EQ(p[4], 0);
  EXPECT_EQ(p[1], 0);
  EXPECT_NEAR(p[0] + p[2], 1.0, 1e-6);
  // top-p small keeps only the argmax.
  ASSERT_TRUE(FilteredProbs(logits.data(), 5, {1.0f, 0, 0.1f, 0.0f}, &p).ok());
  EXPECT_EQ(p[0], 1.0f);
  // min-p: exp(-1) ~ 0.37 of the max survives 0.3, exp(-2) does not.
  ASSERT_TRUE(FilteredProbs(logits.data(), 5, {1.0f, 0, 1.0f, 0.3f}, &p).ok());
  EXPECT_GT(p[2], 0);
  EXPECT_GT(p[4], 0);
  EXPECT_EQ(p[1], 0);
  // NaN logits are refused.
  const std::vector<float> bad = {1.0f, NAN};
  EXPECT_FALSE(FilteredProbs(bad.data(), 2, {1.0f, 0, 1.0f, 0.0f}, &p).ok());
}

// FilteredProbs sorts only the prefix it needs; it keeps exactly the
// definition's tokens, ties at the cut included, over random logits (some
// with many ties, some flat enough that the nucleus spans most of a large
// vocabulary) and filter settings.
TEST(Sampling, FiltersMatchTheFullSortDefinition) {
  std::mt19937 rng(5);
  const std::vector<SamplingConfig> configs = {
      {0.8f, 0, 1.0f, 0.0f},   {0.8f, 3, 1.0f, 0.0f},   {1.3f, 40, 0.9f, 0.0f},
      {0.7f, 0, 0.5f, 0.0f},   {2.5f, 0, 0.99f, 0.0f},  {1.0f, 0, 1.0f, 0.05f},
      {1.0f, 600, 0.95f, 0.1f}, {0.9f, 0, 0.8f, 0.02f}, {1.0f, 5000, 0.7f, 0.0f}};
  for (int vocab : {1, 7, 300, 5000}) {
    for (int ties : {0, 1}) {
      std::normal_distribution<float> d(0.0f, 2.0f);
      std::vector<float> logits(vocab);
      for (float& x : logits) x = ties ? std::round(d(rng)) : d(rng);
      for (const SamplingConfig& c : configs) {
        const std::string what = "vocab " + std::to_string(vocab) + " ties " +
                                 std::to_string(ties) + " top_k " + std::to_string(c.top_k) +
                                 " top_p " + std::to_string(c.top_p) + " min_p " +
                                 std::to_string(c.min_p);
        std::vector<float> got;
        ASSERT_TRUE(FilteredProbs(logits.data(), vocab, c, &got).ok()) << what;
        const std::vector<double> want = FilteredProbsByFullSort(logits, c);
        for (int i = 0; i < vocab; ++i) {
          ASSERT_EQ(got[i] > 0.0f, want[i] > 0.0) << what << " token " << i;
          EXPECT_NEAR(got[i], want[i], 1e-6 * want[i] + 1e-12) << what << " token " << i;
        }
      }
    }
  }
}

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
