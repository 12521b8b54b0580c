// Tests of the logit controls (logit_adjust.h) against a plain reference:
// vLLM's formulas over dense per-token counts recomputed from the whole
// history, compared bit for bit with the incremental TokenCounts as tokens
// are pushed and popped; and ChooseToken's greedy and sampled picks.
#include "kernels/sampling/logit_adjust.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/sampling/sampling.h"

namespace specserve::sampling {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// vLLM's order on dense arrays: min_tokens mask, logit_bias, repetition
// over prompt ∪ output, then frequency and presence over the output.
std::vector<float> Reference(const LogitAdjustments& a,
                             const std::vector<int32_t>& history,
                             size_t output_start, std::vector<float> logits) {
  const int V = static_cast<int>(logits.size());
  std::vector<int> in_prompt(V, 0), output_count(V, 0);
  for (size_t i = 0; i < history.size(); ++i) {
    if (i < output_start) {
      in_prompt[history[i]] = 1;
    } else {
      ++output_count[history[i]];
    }
  }
  const size_t output_len = history.size() - output_start;
  if (a.min_tokens > 0 && output_len < static_cast<size_t>(a.min_tokens)) {
    for (int32_t id : a.stop_ids) logits[id] = -kInf;
  }
  for (const auto& [id, bias] : a.logit_bias) logits[id] += bias;
  for (int t = 0; t < V; ++t) {
    if (in_prompt[t] || output_count[t] > 0) {
      float& x = logits[t];
      if (x > 0) {
        x = x / a.repetition_penalty;
      } else if (x > -kInf) {
        x = x * a.repetition_penalty;
      }
    }
    if (output_count[t] > 0) {
      logits[t] -= a.frequency_penalty * static_cast<float>(output_count[t]);
      logits[t] -= a.presence_penalty;
    }
  }
  return logits;
}

std::vector<float> RandomLogits(std::mt19937* rng, int V) {
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> x(V);
  for (float& v : x) v = d(*rng);
  return x;
}

std::vector<float> Applied(const LogitAdjustments& a, const TokenCounts& c,
                           std::vector<float> logits) {
  ApplyLogitAdjustments(a, c, absl::MakeSpan(logits));
  return logits;
}

TEST(LogitAdjust, MatchesTheReferenceAsTokensArePushedAndPopped) {
  std::mt19937 rng(7);
  constexpr int V = 97;
  for (int trial = 0; trial < 40; ++trial) {
    LogitAdjustments a;
    a.presence_penalty = std::uniform_real_distribution<float>(-2, 2)(rng);
    a.frequency_penalty = std::uniform_real_distribution<float>(-2, 2)(rng);
    a.repetition_penalty =
        trial % 4 == 0 ? 1.0f
                       : std::uniform_real_distribution<float>(0.3f, 2)(rng);
    for (int i = 0; i < trial % 5; ++i) {
      a.logit_bias.push_back(
          {static_cast<int32_t>(7 * i + trial % 7),
           std::uniform_real_distribution<float>(-100, 100)(rng)});
    }
    a.min_tokens = trial % 3 == 0 ? 0 : 1 + trial % 6;
    a.stop_ids = {3, 50};
    ASSERT_TRUE(ValidateLogitAdjustments(a, V).ok());
    std::uniform_int_distribution<int32_t> tok(0, 40);  // repeats likely
    std::vector<int32_t> history(3 + trial % 9);
    for (int32_t& t : history) t = tok(rng);
    const size_t output_start = history.size() - trial % 3;
    TokenCounts counts(history, output_start, /*count=*/true);
    // Grow the output, trying and taking back "drafts" on the way, and
    // check every position against the from-scratch reference.
    for (int step = 0; step < 12; ++step) {
      const std::vector<float> logits = RandomLogits(&rng, V);
      ASSERT_EQ(counts.length(), static_cast<int64_t>(history.size()));
      EXPECT_EQ(Applied(a, counts, logits),
                Reference(a, history, output_start, logits))
          << "trial " << trial << " step " << step;
      const int64_t mark = counts.length();
      for (int d = 0; d < 3; ++d) counts.Push(tok(rng));
      counts.PopTo(mark);
      const int32_t next = tok(rng);
      counts.Push(next);
      history.push_back(next);
    }
  }
}

TEST(LogitAdjust, EachControlAlone) {
  const std::vector<int32_t> history = {1, 2, 2, 3, 3, 3};
  // Prompt {1, 2}; output 2, 3, 3, 3.
  const TokenCounts counts(history, 2, true);
  const std::vector<float> logits = {1.0f, 2.0f, -2.0f, 4.0f, 5.0f};
  {
    LogitAdjustments a;
    a.repetition_penalty = 2.0f;  // seen: 1, 2, 3
    EXPECT_EQ(Applied(a, counts, logits),
              (std::vector<float>{1.0f, 1.0f, -4.0f, 2.0f, 5.0f}));
  }
  {
    LogitAdjustments a;
    a.frequency_penalty = 0.5f;  // output counts: 2 once, 3 three times
    EXPECT_EQ(Applied(a, counts, logits),
              (std::vector<float>{1.0f, 2.0f, -2.5f, 2.5f, 5.0f}));
  }
  {
    LogitAdjustments a;
    a.presence_penalty = -1.0f;  // output tokens 2 and 3, once each
    EXPECT_EQ(Applied(a, counts, logits),
              (std::vector<float>{1.0f, 2.0f, -1.0f, 5.0f, 5.0f}));
  }
  {
    LogitAdjustments a;
    a.logit_bias = {{0, -100.0f}, {4, 0.5f}};
    EXPECT_EQ(Applied(a, counts, logits),
              (std::vector<float>{-99.0f, 2.0f, -2.0f, 4.0f, 5.5f}));
  }
  {
    LogitAdjustments a;  // 4 output tokens: masked below 5, not at 4
    a.stop_ids = {4};
    a.min_tokens = 5;
    EXPECT_EQ(Applied(a, counts, logits)[4], -kInf);
    a.min_tokens = 4;
    EXPECT_EQ(Applied(a, counts, logits)[4], 5.0f);
  }
}

TEST(LogitAdjust, PenaltiesSaturateAndKeepMasks) {
  const std::vector<int32_t> history = {0, 1};
  const TokenCounts counts(history, 0, true);
  LogitAdjustments a;
  a.repetition_penalty = 1e-30f;
  a.min_tokens = 5;
  a.stop_ids = {1};
  const std::vector<float> got = Applied(a, counts, {1e10f, 1.0f, 2.0f});
  EXPECT_EQ(got[0], std::numeric_limits<float>::max());
  EXPECT_EQ(got[1], -kInf);
  EXPECT_EQ(got[2], 2.0f);
}

TEST(LogitAdjust, ChooseTokenNeverPicksAMaskedToken) {
  std::mt19937 rng(3);
  constexpr int V = 50;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> row = RandomLogits(&rng, V);
    // The most likely token is the one banned.
    const int banned = ArgmaxFirst(row.data(), V);
    row[banned] = -kInf;
    const int second = ArgmaxFirst(row.data(), V);
    for (SamplingConfig c : {SamplingConfig{0.0f, 0, 1.0f, 0.0f},
                             SamplingConfig{1.0f, 0, 1.0f, 0.0f},
                             SamplingConfig{5.0f, V, 1.0f, 0.0f},
                             SamplingConfig{2.0f, 0, 0.99f, 0.0f},
                             SamplingConfig{0.7f, 0, 1.0f, 0.01f}}) {
      const float u = std::uniform_real_distribution<float>(0, 1)(rng);
      absl::StatusOr<int32_t> t = ChooseToken(row, c, u);
      ASSERT_TRUE(t.ok()) << t.status();
      EXPECT_NE(*t, banned);
      if (c.greedy()) EXPECT_EQ(*t, second);
    }
  }
}

TEST(LogitAdjust, ChooseTokenEqualsTheFiltersOnUnmaskedRows) {
  std::mt19937 rng(5);
  constexpr int V = 64;
  const SamplingConfig c{0.8f, 20, 0.9f, 0.0f};
  for (int trial = 0; trial < 100; ++trial) {
    const std::vector<float> row = RandomLogits(&rng, V);
    const float u = std::uniform_real_distribution<float>(0, 1)(rng);
    std::vector<float> probs;
    ASSERT_TRUE(FilteredProbs(row.data(), V, c, &probs).ok());
    EXPECT_EQ(*ChooseToken(row, c, u), SampleIndex(probs, u));
  }
}

TEST(LogitAdjust, ChooseTokenRefusesNanAndAllMasked) {
  const SamplingConfig greedy;
  EXPECT_EQ(ChooseToken({1.0f, NAN}, greedy, 0.5f).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ChooseToken({kInf, 0.0f}, greedy, 0.5f).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ChooseToken({-kInf, -kInf}, greedy, 0.5f).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(LogitAdjust, ValidationNamesTheField) {
  auto message = [](const LogitAdjustments& a) {
    absl::Status s = ValidateLogitAdjustments(a, 100);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    return std::string(s.message());
  };
  LogitAdjustments a;
  a.presence_penalty = 2.5f;
  EXPECT_NE(message(a).find("sampling.presence_penalty"), std::string::npos);
  a = {};
  a.frequency_penalty = NAN;
  EXPECT_NE(message(a).find("sampling.frequency_penalty"), std::string::npos);
  a = {};
  a.repetition_penalty = 0.0f;
  EXPECT_NE(message(a).find("sampling.repetition_penalty"), std::string::npos);
  a = {};
  a.logit_bias = {{100, 1.0f}};
  EXPECT_NE(message(a).find("sampling.logit_bias"), std::string::npos);
  a.logit_bias = {{5, 101.0f}};
  EXPECT_NE(message(a).find("sampling.logit_bias"), std::string::npos);
  a.logit_bias = {{5, 1.0f}, {5, 2.0f}};
  EXPECT_NE(message(a).find("repeated"), std::string::npos);
  a.logit_bias.assign(kMaxLogitBias + 1, {1, 1.0f});
  EXPECT_NE(message(a).find("at most 1024"), std::string::npos);
  a = {};
  a.presence_penalty = -2.0f;
  a.repetition_penalty = 7.0f;
  a.logit_bias = {{99, -100.0f}};
  EXPECT_TRUE(ValidateLogitAdjustments(a, 100).ok());
}

}  // namespace
}  // namespace specserve::sampling
