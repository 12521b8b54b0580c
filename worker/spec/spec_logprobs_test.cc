// Property tests of the engine's logprobs on real checkpoints (the tiny
// random models and the default model): over two-turn sessions with several
// prompts, draft depths, burst schedules (fixed, random, a demotion midway)
// and sampling settings (greedy, sampled with and without filters, with the
// same seed), speculative bursts report exactly the logprobs of plain
// decoding, bit for bit, for every generated and every prompt token; and
// both equal ComputeLogprobs of the logits that token-by-token Decode gives
// at the position before each token (the oracle): bit for bit where the
// backend's prefill runs the decode ops, within the prefill tolerance where it
// runs its prefill forms (CUDA). On the backend the target links
// (worker/model/test_backend.h).
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/model.h"
#include "worker/model/test_backend.h"
#include "worker/model/test_data.h"
#include "worker/spec/logprobs.h"
#include "worker/spec/spec_engine.h"

namespace specserve::spec {
namespace {

using model::ForwardResult;
using model::Model;

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Equal ids and bit-identical values; an empty string when they are.
std::string Diff(const TokenLogprobs& a, const TokenLogprobs& b) {
  if (a.id != b.id) {
    return "id " + std::to_string(a.id) + " vs " + std::to_string(b.id);
  }
  if (!SameBits(a.logprob, b.logprob)) {
    return "logprob of " + std::to_string(a.id) + ": " +
           std::to_string(a.logprob) + " vs " + std::to_string(b.logprob);
  }
  if (a.top_ids != b.top_ids) return "top ids differ";
  if (a.top_logprobs.size() != b.top_logprobs.size()) return "top sizes differ";
  for (size_t i = 0; i < a.top_logprobs.size(); ++i) {
    if (!SameBits(a.top_logprobs[i], b.top_logprobs[i])) {
      return "top logprob " + std::to_string(i) + " differs";
    }
  }
  return "";
}

void ExpectSame(const std::vector<TokenLogprobs>& got,
                const std::vector<TokenLogprobs>& want,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const std::string d = Diff(got[i], want[i]);
    EXPECT_TRUE(d.empty()) << what << " [" << i << "]: " << d;
  }
}

// Against token-by-token decode on a backend whose prefill forms are not the
// decode ops (docs/DESIGN.md "Prefill tolerance": logits within 2e-2 of the
// largest logit, so a logprob within twice that): the scored ids equal,
// each logprob within kLogprobTolerance. Bit-exact where the prefill is.
constexpr float kLogprobTolerance = 4e-2f;
void ExpectMatchesDecode(const std::vector<TokenLogprobs>& got,
                         const std::vector<TokenLogprobs>& want,
                         bool exact_prefill, const std::string& what) {
  if (exact_prefill) {
    ExpectSame(got, want, what);
    return;
  }
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].id, want[i].id) << what << " [" << i << "]";
    EXPECT_NEAR(got[i].logprob, want[i].logprob, kLogprobTolerance)
        << what << " [" << i << "]";
  }
}

std::vector<int32_t> RandomTokens(std::mt19937* rng, int n, int vocab) {
  std::uniform_int_distribution<int> d(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(*rng);
  return t;
}

// What one turn of a session produced.
struct Turn {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;
  std::vector<TokenLogprobs> prompt_logprobs;
};

struct Setting {
  sampling::SamplingConfig sampling;
  int top_n = 0;
};

class SpecLogprobsTest : public ::testing::TestWithParam<std::string> {
 protected:
  static constexpr int kCapacity = 256;

  void SetUp() override {
    std::string why;
    backend_ = model::testing::MakeTestBackend(&why);
    if (backend_ == nullptr) GTEST_SKIP() << why;
    auto loaded =
        Model::Load(model::testing::RepoPath(GetParam()), backend_.get());
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    model_ = std::move(*loaded);
    vocab_ = model_->config().vocab_size;
    executor_ = std::make_unique<ModelExecutor>(model_.get());
    engine_ = std::make_unique<SpecEngine>(executor_.get());
  }

  // One turn: `suffix` then bursts of `lengths` (cycled) until at least
  // `want` tokens, or exactly `want` with plain single-token bursts when
  // lengths is empty. `demote_after`: demote once that many tokens came.
  Turn RunTurn(SpecSession* s, const Setting& set, uint64_t seed, int k,
               const std::vector<int32_t>& suffix, int want,
               const std::vector<int>& lengths,
               std::optional<int> demote_after = std::nullopt) {
    Turn t;
    bool first = true;
    size_t next_length = 0;
    while (static_cast<int>(t.tokens.size()) < want) {
      BurstParams p;
      p.k = k;
      p.sampling = set.sampling;
      p.seed = seed;
      p.logprobs = set.top_n;
      p.prompt_logprobs = set.top_n;
      p.max_new = lengths.empty() ? want - static_cast<int>(t.tokens.size())
                                  : lengths[next_length++ % lengths.size()];
      if (first) p.suffix = suffix;
      auto r = engine_->RunBurst(
          s, p,
          [&](absl::Span<const int32_t> ids,
              absl::Span<const TokenLogprobs> lps) {
            EXPECT_EQ(ids.size(), lps.size());
            t.tokens.insert(t.tokens.end(), ids.begin(), ids.end());
            t.logprobs.insert(t.logprobs.end(), lps.begin(), lps.end());
            return true;
          });
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) return t;
      if (first) {
        t.prompt_logprobs = r->prompt_logprobs;
      } else {
        EXPECT_TRUE(r->prompt_logprobs.empty());
      }
      first = false;
      if (demote_after && static_cast<int>(t.tokens.size()) >= *demote_after &&
          s->mode() == DecodeMode::kSpeculative) {
        EXPECT_TRUE(engine_->Demote(s).ok());
      }
    }
    return t;
  }

  // The oracle: ComputeLogprobs(logits after history[0..i-1], history[i])
  // for i = 1..size-1, the logits from token-by-token Decode.
  std::vector<TokenLogprobs> Reference(const std::vector<int32_t>& history,
                                       const Setting& set) {
    auto state = model_->NewState({.capacity = kCapacity}).value();
    std::vector<TokenLogprobs> out;
    ForwardResult r;
    for (size_t i = 0; i + 1 < history.size(); ++i) {
      EXPECT_TRUE(model_->Decode(state.get(), history[i], &r).ok());
      out.push_back(ComputeLogprobs(r.logits, set.sampling.temperature,
                                    history[i + 1], set.top_n));
    }
    return out;
  }

  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<ModelExecutor> executor_;
  std::unique_ptr<SpecEngine> engine_;
  int vocab_ = 0;
};

TEST_P(SpecLogprobsTest, SpeculativeEqualsPlainAndTheOracle) {
  constexpr int kNew = 14;
  const std::vector<Setting> settings = {
      {{0.0f, 0, 1.0f, 0.0f}, 5},    // greedy
      {{0.8f, 0, 1.0f, 0.0f}, 20},   // sampled
      {{1.3f, 20, 0.9f, 0.05f}, 0},  // sampled, filtered (not the values)
  };
  std::mt19937 rng(31);
  int trial = 0;
  for (const Setting& set : settings) {
    for (int k : {1, 3, 6}) {
      for (int schedule = 0; schedule < 3; ++schedule, ++trial) {
        SCOPED_TRACE("T=" + std::to_string(set.sampling.temperature) +
                     " k=" + std::to_string(k) +
                     " schedule=" + std::to_string(schedule));
        const uint64_t seed = 777 + trial;
        const std::vector<int32_t> prompt =
            RandomTokens(&rng, 2 + rng() % 10, vocab_);
        const std::vector<int32_t> suffix =
            RandomTokens(&rng, 1 + rng() % 5, vocab_);
        std::vector<int> lengths;
        std::optional<int> demote_after;
        if (schedule == 0) lengths = {1};
        if (schedule >= 1) {
          for (int i = 0; i < 8; ++i) lengths.push_back(1 + rng() % 7);
        }
        if (schedule == 2) demote_after = kNew + 3;  // in the second turn

        // Speculative, admitted empty: the prompt comes with the first
        // burst, as the scheduler sends it.
        auto spec = engine_->Admit("spec", kCapacity, {}).value();
        const Turn s1 = RunTurn(spec.get(), set, seed, k, prompt, kNew, lengths,
                                demote_after);
        const Turn s2 = RunTurn(spec.get(), set, seed, k, suffix, kNew, lengths,
                                demote_after);
        // Plain, for exactly the tokens the speculative turns produced
        // (their last round may overshoot).
        auto plain = engine_
                         ->Admit("plain", kCapacity, {}, std::nullopt,
                                 /*speculative=*/false)
                         .value();
        const Turn p1 = RunTurn(plain.get(), set, seed, 0, prompt,
                                static_cast<int>(s1.tokens.size()), {});
        const Turn p2 = RunTurn(plain.get(), set, seed, 0, suffix,
                                static_cast<int>(s2.tokens.size()), {});
        ASSERT_EQ(s1.tokens, p1.tokens);
        ASSERT_EQ(s2.tokens, p2.tokens);
        ExpectSame(s1.logprobs, p1.logprobs, "turn 1 logprobs");
        ExpectSame(s2.logprobs, p2.logprobs, "turn 2 logprobs");
        ExpectSame(s1.prompt_logprobs, p1.prompt_logprobs, "turn 1 prompt");
        ExpectSame(s2.prompt_logprobs, p2.prompt_logprobs, "turn 2 prompt");

        // The oracle over the whole history: the first prompt token has no
        // predecessor; every later token is scored by the row before it,
        // the second turn's first prompt token by the first turn's last.
        std::vector<int32_t> history = prompt;
        history.insert(history.end(), s1.tokens.begin(), s1.tokens.end());
        history.insert(history.end(), suffix.begin(), suffix.end());
        history.insert(history.end(), s2.tokens.begin(), s2.tokens.end());
        const std::vector<TokenLogprobs> ref = Reference(history, set);
        std::vector<TokenLogprobs> got = s1.prompt_logprobs;
        for (const Turn* t : {&s1, &s2}) {
          if (t == &s2) {
            got.insert(got.end(), s2.prompt_logprobs.begin(),
                       s2.prompt_logprobs.end());
          }
          got.insert(got.end(), t->logprobs.begin(), t->logprobs.end());
        }
        ExpectMatchesDecode(got, ref, backend_->ExactPrefill(),
                            "vs token-by-token decode");

        for (const Turn* t : {&s1, &s2}) {
          for (const TokenLogprobs& lp : t->logprobs) {
            ASSERT_EQ(static_cast<int>(lp.top_ids.size()), set.top_n);
            // Greedy chooses the most likely token.
            if (set.sampling.greedy() && set.top_n > 0) {
              EXPECT_EQ(lp.logprob, lp.top_logprobs[0]);
            }
          }
        }
      }
    }
  }
}

// Without the options nothing is computed: no logprobs reach the callback
// and the result has no prompt logprobs.
TEST_P(SpecLogprobsTest, OffByDefault) {
  std::mt19937 rng(3);
  auto s = engine_->Admit("off", kCapacity, {}).value();
  for (int k : {0, 3}) {
    BurstParams p;
    p.k = k;
    p.max_new = 6;
    p.suffix = RandomTokens(&rng, 5, vocab_);
    int calls = 0;
    auto r = engine_->RunBurst(s.get(), p,
                               [&](absl::Span<const int32_t> ids,
                                   absl::Span<const TokenLogprobs> lps) {
                                 EXPECT_FALSE(ids.empty());
                                 EXPECT_TRUE(lps.empty());
                                 ++calls;
                                 return true;
                               });
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_GT(calls, 0);
    EXPECT_TRUE(r->prompt_logprobs.empty());
  }
}

// A prompt longer than one prefill pass (Model::kMaxRows rows) is scored
// across the chunk boundaries like a short one.
TEST_P(SpecLogprobsTest, LongPromptAcrossPrefillChunks) {
  std::mt19937 rng(5);
  const std::vector<int32_t> prompt =
      RandomTokens(&rng, 2 * Model::kMaxRows + 7, vocab_);
  const Setting set{{0.0f, 0, 1.0f, 0.0f}, 2};
  auto s = engine_->Admit("long", kCapacity, {}).value();
  const Turn t = RunTurn(s.get(), set, 1, 2, prompt, 3, {3});
  std::vector<int32_t> history = prompt;
  history.insert(history.end(), t.tokens.begin(), t.tokens.end());
  std::vector<TokenLogprobs> got = t.prompt_logprobs;
  got.insert(got.end(), t.logprobs.begin(), t.logprobs.end());
  ExpectMatchesDecode(got, Reference(history, set), backend_->ExactPrefill(),
                      "long prompt");
}

std::vector<std::string> ModelDirs() {
  std::vector<std::string> dirs = model::testing::TestModelDirs();
  dirs.push_back("models/specserve-tiny-py");  // models/default
  return dirs;
}

INSTANTIATE_TEST_SUITE_P(Models, SpecLogprobsTest,
                         ::testing::ValuesIn(ModelDirs()),
                         model::testing::PathParamName);

}  // namespace
}  // namespace specserve::spec
