// Tests of the host sampling primitives: Philox known answers, the filters
// (temperature, top-k, top-p, min-p) against their full-sort definition.
#include "kernels/sampling/sampling.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/sampling/philox.h"
#include "kernels/sampling/sampling_reference.h"

namespace specserve::sampling {
namespace {

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

TEST(Philox, UniformIsInRangeAndPure) {
  for (uint32_t c = 0; c < 1000; ++c) {
    const float u = Uniform(42, RandomStream::kSample, c);
    EXPECT_GE(u, 0.0f);
    EXPECT_LT(u, 1.0f);
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
      {0.8f, 0, 1.0f, 0.0f},    {0.8f, 3, 1.0f, 0.0f},
      {1.3f, 40, 0.9f, 0.0f},   {0.7f, 0, 0.5f, 0.0f},
      {2.5f, 0, 0.99f, 0.0f},   {1.0f, 0, 1.0f, 0.05f},
      {1.0f, 600, 0.95f, 0.1f}, {0.9f, 0, 0.8f, 0.02f},
      {1.0f, 5000, 0.7f, 0.0f}};
  for (int vocab : {1, 7, 300, 5000}) {
    for (int ties : {0, 1}) {
      std::normal_distribution<float> d(0.0f, 2.0f);
      std::vector<float> logits(vocab);
      for (float& x : logits) x = ties ? std::round(d(rng)) : d(rng);
      for (const SamplingConfig& c : configs) {
        const std::string what =
            "vocab " + std::to_string(vocab) + " ties " + std::to_string(ties) +
            " top_k " + std::to_string(c.top_k) + " top_p " +
            std::to_string(c.top_p) + " min_p " + std::to_string(c.min_p);
        std::vector<float> got;
        ASSERT_TRUE(FilteredProbs(logits.data(), vocab, c, &got).ok()) << what;
        const std::vector<double> want = FilteredProbsByFullSort(logits, c);
        for (int i = 0; i < vocab; ++i) {
          ASSERT_EQ(got[i] > 0.0f, want[i] > 0.0) << what << " token " << i;
          EXPECT_NEAR(got[i], want[i], 1e-6 * want[i] + 1e-12)
              << what << " token " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace specserve::sampling
