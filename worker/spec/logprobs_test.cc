// ComputeLogprobs against a straightforward double-precision reference:
// values, the top-n order (descending, ties by lower id), temperature, and
// rows whose logits would overflow a naive softmax.
#include "worker/spec/logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace specserve::spec {
namespace {

// log(exp(x_i / T) / sum_j exp(x_j / T)), each term in long double.
std::vector<double> Reference(const std::vector<float>& x, double t) {
  long double m = -INFINITY;
  for (float v : x)
    m = std::max<long double>(m, v / static_cast<long double>(t));
  long double sum = 0;
  for (float v : x) sum += std::exp(v / static_cast<long double>(t) - m);
  std::vector<double> out;
  for (float v : x) {
    out.push_back(static_cast<double>(v / static_cast<long double>(t) - m -
                                      std::log(sum)));
  }
  return out;
}

std::vector<int32_t> ReferenceTop(const std::vector<double>& lp, int n) {
  std::vector<int32_t> order(lp.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return lp[a] > lp[b]; });
  order.resize(std::min<size_t>(n, lp.size()));
  return order;
}

TEST(LogprobsTest, MatchesReferenceOverTemperaturesAndTopN) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-12.0f, 12.0f);
  for (int V : {1, 2, 17, 1000, 6144}) {
    std::vector<float> x(V);
    for (float& v : x) v = u(rng);
    for (float temp : {0.0f, 1.0f, 0.3f, 2.5f}) {
      const std::vector<double> ref = Reference(x, temp > 0 ? temp : 1.0);
      for (int n : {0, 1, 5, 20}) {
        const int32_t id = static_cast<int32_t>(rng() % V);
        const TokenLogprobs got = ComputeLogprobs(x, temp, id, n);
        EXPECT_EQ(got.id, id);
        EXPECT_NEAR(got.logprob, ref[id], 1e-5) << "V " << V << " T " << temp;
        const std::vector<int32_t> want = ReferenceTop(ref, n);
        ASSERT_EQ(got.top_ids, want) << "V " << V << " T " << temp;
        ASSERT_EQ(got.top_logprobs.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) {
          EXPECT_NEAR(got.top_logprobs[i], ref[want[i]], 1e-5);
          if (i > 0) {
            EXPECT_GE(got.top_logprobs[i - 1], got.top_logprobs[i]);
          }
        }
      }
    }
  }
}

TEST(LogprobsTest, ProbabilitiesSumToOne) {
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0.0f, 4.0f);
  std::vector<float> x(6144);
  for (float& v : x) v = g(rng);
  double sum = 0;
  for (int i = 0; i < static_cast<int>(x.size()); ++i) {
    sum +=
        std::exp(static_cast<double>(ComputeLogprobs(x, 0.7f, i, 0).logprob));
  }
  EXPECT_NEAR(sum, 1.0, 1e-4);
}

TEST(LogprobsTest, TiesGoToTheLowerId) {
  const std::vector<float> x = {1.0f, 3.0f, 2.0f, 3.0f, 3.0f, 0.5f};
  const TokenLogprobs got = ComputeLogprobs(x, 1.0f, 5, 4);
  EXPECT_EQ(got.top_ids, (std::vector<int32_t>{1, 3, 4, 2}));
  EXPECT_EQ(got.top_logprobs[0], got.top_logprobs[1]);
  EXPECT_EQ(got.top_logprobs[1], got.top_logprobs[2]);
  // Three equal maxima: each has probability e^3 / (3e^3 + e^2 + e + e^0.5).
  const double z =
      3 * std::exp(3.0) + std::exp(2.0) + std::exp(1.0) + std::exp(0.5);
  EXPECT_NEAR(got.top_logprobs[0], 3.0 - std::log(z), 1e-6);
  EXPECT_NEAR(got.logprob, 0.5 - std::log(z), 1e-6);
}

TEST(LogprobsTest, LargeLogitsDoNotOverflow) {
  std::vector<float> x = {1.0e4f, 1.0e4f - 1.0f, -1.0e4f};
  const TokenLogprobs got = ComputeLogprobs(x, 1.0f, 1, 3);
  ASSERT_TRUE(std::isfinite(got.logprob));
  EXPECT_NEAR(got.logprob, -1.0 - std::log1p(std::exp(-1.0)), 1e-6);
  EXPECT_EQ(got.top_ids, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_NEAR(got.top_logprobs[2], -2.0e4, 1.0);
}

TEST(LogprobsTest, TemperatureScalesBeforeTheSoftmax) {
  const std::vector<float> x = {0.0f, 1.0f};
  // T = 0.5: softmax over {0, 2}.
  EXPECT_NEAR(ComputeLogprobs(x, 0.5f, 1, 0).logprob,
              -std::log1p(std::exp(-2.0)), 1e-6);
  // T = 0 (greedy) reads as 1.
  EXPECT_EQ(ComputeLogprobs(x, 0.0f, 1, 0).logprob,
            ComputeLogprobs(x, 1.0f, 1, 0).logprob);
}

TEST(LogprobsTest, TopNIsCappedByTheVocabulary) {
  const std::vector<float> x = {0.0f, 2.0f, 1.0f};
  const TokenLogprobs got = ComputeLogprobs(x, 1.0f, 0, 20);
  EXPECT_EQ(got.top_ids, (std::vector<int32_t>{1, 2, 0}));
  EXPECT_EQ(got.top_logprobs[2], got.logprob);
}

}  // namespace
}  // namespace specserve::spec
