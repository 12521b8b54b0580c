// Tests of the speculative-decoding primitives: the accept step, the
// position-keyed uniforms of sampled decoding (a sampled round emits exactly
// the tokens plain sampling draws at the same positions) and telemetry
// deltas. (The sampling filters' tests are in kernels/sampling.)
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/sampling/sampling.h"
#include "telemetry/spec_telemetry.h"
#include "worker/spec/spec_accept.h"

namespace specserve::spec {
namespace {

using telemetry::SpecTelemetry;

TEST(Accept, TakesTheLongestMatchingPrefix) {
  EXPECT_EQ(AcceptRound({5, 6, 7}, {5, 6, 9, 1}).accepted, 2);
  EXPECT_EQ(AcceptRound({5, 6, 7}, {5, 6, 9, 1}).bonus, 9);
  EXPECT_EQ(AcceptRound({5, 6, 7}, {5, 6, 7, 1}).accepted, 3);
  EXPECT_EQ(AcceptRound({5, 6, 7}, {5, 6, 7, 1}).bonus, 1);
  EXPECT_EQ(AcceptRound({5}, {4, 1}).accepted, 0);
  EXPECT_EQ(AcceptRound({5}, {4, 1}).bonus, 4);
}

TEST(PositionUniform, IsAFunctionOfSeedAndPosition) {
  std::set<float> seen;
  for (int64_t pos = 0; pos < 1000; ++pos) {
    const float u = PositionUniform(7, pos);
    EXPECT_GE(u, 0.0f);
    EXPECT_LT(u, 1.0f);
    EXPECT_EQ(u, PositionUniform(7, pos));
    seen.insert(u);
  }
  EXPECT_GT(seen.size(), 990u);  // distinct draws, up to 24-bit collisions
  EXPECT_NE(PositionUniform(7, 3), PositionUniform(8, 3));
}

std::vector<float> RandomDist(std::mt19937* rng, int v, double sharpness) {
  std::gamma_distribution<double> g(sharpness, 1.0);
  std::vector<float> p(v);
  double s = 0;
  for (auto& x : p) s += (x = static_cast<float>(g(*rng)));
  for (auto& x : p) x = static_cast<float>(x / s);
  return p;
}

// A sampled round as the engine runs it, over host distributions: draft i is
// q_i's draw and column j's target p_j's draw at the uniform of the position
// they stand for. Whatever the drafts, the emitted tokens are the plain
// draws from p at those positions; drafts from a q close to p are accepted
// often, and from an unrelated q rarely.
TEST(SampledRound, EmitsThePlainDrawsAtEachPosition) {
  std::mt19937 rng(5);
  const int v = 50, k = 4;
  int accepted_of[2] = {0, 0};
  for (int close : {0, 1}) {
    const double closeness = close ? 0.9 : 0.0;
    int& accepted = accepted_of[close];
    for (int trial = 0; trial < 300; ++trial) {
      const uint64_t seed = 1000 + trial;
      const int64_t first = 17 * trial;  // index of draft 1's position
      std::vector<std::vector<float>> p, q;
      for (int j = 0; j <= k; ++j) {
        p.push_back(RandomDist(&rng, v, 0.3));
        std::vector<float> other = RandomDist(&rng, v, 0.3);
        for (int t = 0; t < v; ++t) {
          other[t] = static_cast<float>(closeness * p[j][t] +
                                        (1 - closeness) * other[t]);
        }
        q.push_back(other);
      }
      std::vector<int> drafts, target, plain;
      for (int j = 0; j <= k; ++j) {
        const float u = PositionUniform(seed, first + j);
        target.push_back(sampling::SampleIndex(p[j], u));
        plain.push_back(target.back());
        if (j < k) drafts.push_back(sampling::SampleIndex(q[j], u));
      }
      const RoundOutcome r = AcceptRound(drafts, target);
      // Emitted: d_1..d_n then the bonus, each the plain draw there.
      for (int i = 0; i < r.accepted; ++i) EXPECT_EQ(drafts[i], plain[i]);
      EXPECT_EQ(r.bonus, plain[r.accepted]);
      accepted += r.accepted;
    }
  }
  EXPECT_GT(accepted_of[1], 3 * accepted_of[0])
      << "drafts close to the target are accepted far more often";
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
