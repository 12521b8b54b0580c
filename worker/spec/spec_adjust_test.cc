// Property tests of the logit controls (penalties, logit_bias, min_tokens)
// in the speculative-session engine, on the tiny random models and the
// default model: the engine's output, plain (k = 0) and speculative (k =
// 1..6) over any burst lengths, equals a plain reference that decodes one
// token at a time and adjusts each row from the history before it; greedy
// and sampled. Penalties change the output; a token biased by -100 never
// appears; min_tokens holds stop tokens back; a rebuild from the history
// continues the same; bad controls are refused and leave the session
// usable. spec_adjust_test on the CPU, spec_adjust_cuda_test on CUDA.
#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/sampling/logit_adjust.h"
#include "worker/model/model.h"
#include "worker/model/test_backend.h"
#include "worker/model/test_data.h"
#include "worker/spec/spec_accept.h"
#include "worker/spec/spec_engine.h"

namespace specserve::spec {
namespace {

using model::ForwardResult;
using model::Model;
using sampling::LogitAdjustments;

constexpr int kCapacity = 256;

// Plain decoding with the controls, one token per step outside the engine:
// row p's adjustment comes from the history before p (the prompt, then the
// output), recounted from scratch; the pick is ChooseToken at p's uniform.
// Stops after a stop token (p.stop_ids) or n tokens.
std::vector<int32_t> Reference(Model* m, const std::vector<int32_t>& prompt,
                               const BurstParams& p, int n) {
  const int V = m->config().vocab_size;
  model::StateOptions o;
  o.capacity = kCapacity;
  auto state = m->NewState(o).value();
  ForwardResult r;
  EXPECT_TRUE(m->Prefill(state.get(), prompt, {}, &r).ok());
  std::vector<float> row(r.logits.end() - V, r.logits.end());
  std::vector<int32_t> history = prompt, out;
  while (static_cast<int>(out.size()) < n) {
    const sampling::TokenCounts counts(history, prompt.size(), true);
    sampling::ApplyLogitAdjustments(p.adjust, counts, absl::MakeSpan(row));
    const float u =
        p.sampling.greedy() ? 0.0f : PositionUniform(p.seed, history.size());
    const int32_t t = sampling::ChooseToken(row, p.sampling, u).value();
    out.push_back(t);
    if (std::count(p.stop_ids.begin(), p.stop_ids.end(), t)) break;
    history.push_back(t);
    r = ForwardResult();
    EXPECT_TRUE(m->Decode(state.get(), t, &r).ok());
    row = r.logits;
  }
  return out;
}

// The engine's output for one request of up to n tokens in bursts of the
// given lengths (cycled), its prompt as the first burst's suffix or as the
// admitted history. Cut at n, or after the first stop token.
std::vector<int32_t> EngineRun(SpecEngine* engine,
                               const std::vector<int32_t>& prompt,
                               BurstParams p, int n,
                               const std::vector<int>& bursts,
                               bool prompt_as_suffix) {
  auto s = engine
               ->Admit("s", kCapacity,
                       prompt_as_suffix ? std::vector<int32_t>{} : prompt)
               .value();
  std::vector<int32_t> out;
  for (size_t i = 0; static_cast<int>(out.size()) < n; ++i) {
    BurstParams q = p;
    q.max_new = bursts[i % bursts.size()];
    q.prior_output = static_cast<int>(out.size());
    if (i == 0 && prompt_as_suffix) q.suffix = prompt;
    absl::StatusOr<BurstResult> r =
        engine->RunBurst(s.get(), q, [&](absl::Span<const int32_t> t) {
          out.insert(out.end(), t.begin(), t.end());
          return true;
        });
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok() || r->end == BurstEnd::kStopToken) break;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (std::count(p.stop_ids.begin(), p.stop_ids.end(), out[i])) {
      out.resize(i + 1);
      break;
    }
  }
  if (static_cast<int>(out.size()) > n) out.resize(n);
  return out;
}

// Controls that bite on random models, whose greedy output repeats.
std::vector<LogitAdjustments> Controls(int vocab) {
  std::vector<LogitAdjustments> all;
  LogitAdjustments a;
  a.repetition_penalty = 1.8f;
  all.push_back(a);
  a = {};
  a.frequency_penalty = 1.5f;
  a.presence_penalty = 0.5f;
  all.push_back(a);
  a = {};
  a.presence_penalty = -2.0f;  // favours repeats
  a.repetition_penalty = 0.7f;
  a.logit_bias = {{1, 3.0f}, {vocab - 1, -5.0f}};
  all.push_back(a);
  a = {};
  a.frequency_penalty = 2.0f;
  a.repetition_penalty = 1.3f;
  a.logit_bias = {{0, 8.0f}};  // token 0 favoured until penalized
  all.push_back(a);
  return all;
}

std::vector<std::string> ModelDirs() {
  std::vector<std::string> dirs = model::testing::TestModelDirs();
  dirs.push_back("models/specserve-tiny-py");  // models/default
  return dirs;
}

class SpecAdjustTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    backend_ = model::testing::MakeTestBackend(&why);
    if (backend_ == nullptr) GTEST_SKIP() << why;
    auto loaded =
        Model::Load(model::testing::ModelDirOf(GetParam()), backend_.get());
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    model_ = std::move(*loaded);
    vocab_ = model_->config().vocab_size;
  }
  std::vector<int32_t> Prompt(std::mt19937* rng, int n) {
    return model::testing::RandomTokens(n, vocab_, rng);
  }
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<Model> model_;
  int vocab_ = 0;
};

// Greedy with penalties and biases: plain and speculative (every k, any
// bursts) equal the reference token for token, and the controls change
// the output.
TEST_P(SpecAdjustTest, GreedySpecEqualsPlainUnderPenalties) {
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(17);
  constexpr int kNew = 24;
  int changed = 0;
  const std::vector<LogitAdjustments> controls = Controls(vocab_);
  for (size_t c = 0; c < controls.size(); ++c) {
    for (int trial = 0; trial < 2; ++trial) {
      const std::vector<int32_t> prompt = Prompt(&rng, 4 + 5 * trial);
      BurstParams p;
      p.adjust = controls[c];
      const std::vector<int32_t> want =
          Reference(model_.get(), prompt, p, kNew);
      BurstParams plain_params;  // no controls
      if (Reference(model_.get(), prompt, plain_params, kNew) != want) {
        ++changed;
      }
      for (int k : {0, 1, 2, 4, 6}) {
        p.k = k;
        const std::vector<int> bursts =
            k % 2 ? std::vector<int>{1, 5, 3} : std::vector<int>{32};
        EXPECT_EQ(EngineRun(&engine, prompt, p, kNew, bursts, trial == 1), want)
            << "controls " << c << " trial " << trial << " k " << k;
      }
    }
  }
  EXPECT_GT(changed, 0) << "no control changed any output";
}

// Sampled with the controls: for one seed, every k gives the reference's
// tokens.
TEST_P(SpecAdjustTest, SampledSpecEqualsPlainUnderPenalties) {
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(29);
  constexpr int kNew = 20;
  const std::vector<LogitAdjustments> controls = Controls(vocab_);
  for (size_t c = 0; c < controls.size(); ++c) {
    const std::vector<int32_t> prompt = Prompt(&rng, 6);
    BurstParams p;
    p.adjust = controls[c];
    p.sampling = {c % 2 ? 1.0f : 0.7f, c == 2 ? 30 : 0, c == 1 ? 0.9f : 1.0f,
                  c == 3 ? 0.05f : 0.0f};
    p.seed = 777 + c;
    const std::vector<int32_t> want = Reference(model_.get(), prompt, p, kNew);
    for (int k : {0, 1, 3, 5}) {
      p.k = k;
      EXPECT_EQ(EngineRun(&engine, prompt, p, kNew, {4, 7}, c % 2 == 1), want)
          << "controls " << c << " k " << k;
    }
  }
}

// A token biased by -100 never appears, greedy or sampled, plain or
// speculative, where it was the most frequent token without the bias.
TEST_P(SpecAdjustTest, BannedTokenNeverAppears) {
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(31);
  constexpr int kNew = 32;
  for (int trial = 0; trial < 3; ++trial) {
    const std::vector<int32_t> prompt = Prompt(&rng, 5 + trial);
    BurstParams p;
    if (trial > 0) {
      p.sampling = {1.0f, 0, 1.0f, 0.0f};
      p.seed = 91 + trial;
    }
    p.k = 3;
    std::map<int32_t, int> seen;
    for (int32_t t : EngineRun(&engine, prompt, p, kNew, {32}, false)) {
      ++seen[t];
    }
    const int32_t banned =
        std::max_element(seen.begin(), seen.end(), [](auto& a, auto& b) {
          return a.second < b.second;
        })->first;
    p.adjust.logit_bias = {{banned, -100.0f}};
    const std::vector<int32_t> want = Reference(model_.get(), prompt, p, kNew);
    for (int k : {0, 3}) {
      p.k = k;
      const std::vector<int32_t> got =
          EngineRun(&engine, prompt, p, kNew, {32}, false);
      EXPECT_EQ(got, want) << "trial " << trial << " k " << k;
      EXPECT_EQ(std::count(got.begin(), got.end(), banned), 0)
          << "trial " << trial << " k " << k;
    }
  }
}

// min_tokens: the stop token the output would end with at once is held
// back until min_tokens tokens exist, then may end it; plain and
// speculative agree with the reference.
TEST_P(SpecAdjustTest, MinTokensHoldsStopTokensBack) {
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(37);
  for (int trial = 0; trial < 3; ++trial) {
    const std::vector<int32_t> prompt = Prompt(&rng, 5 + trial);
    BurstParams p;
    if (trial == 2) {
      p.sampling = {0.8f, 0, 1.0f, 0.0f};
      p.seed = 5 + trial;
    }
    p.k = 2;
    // Stop at the first token the request would produce, and at the
    // second: without min_tokens, a one-token output.
    const std::vector<int32_t> free_run =
        EngineRun(&engine, prompt, p, 2, {8}, false);
    ASSERT_EQ(free_run.size(), 2u);
    p.stop_ids = {free_run[0], free_run[1]};
    ASSERT_EQ(EngineRun(&engine, prompt, p, 16, {8}, false).size(), 1u);
    for (int min_tokens : {1, 4, 9}) {
      p.adjust.min_tokens = min_tokens;
      p.adjust.stop_ids = p.stop_ids;
      const std::vector<int32_t> want = Reference(model_.get(), prompt, p, 40);
      for (size_t i = 0; i < want.size() && i < size_t(min_tokens); ++i) {
        EXPECT_EQ(std::count(p.stop_ids.begin(), p.stop_ids.end(), want[i]), 0)
            << "a stop token at " << i << " < min_tokens " << min_tokens;
      }
      for (int k : {0, 1, 4}) {
        p.k = k;
        EXPECT_EQ(EngineRun(&engine, prompt, p, 40, {3, 8}, k == 4), want)
            << "trial " << trial << " min_tokens " << min_tokens << " k " << k;
      }
    }
  }
}

// A request whose session is rebuilt from its history midway (as after a
// lost worker) continues as if nothing happened: the controls' counts come
// from the history and prior_output, not from state the lost copy held.
TEST_P(SpecAdjustTest, RebuildMidRequestContinuesTheSame) {
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(41);
  const std::vector<int32_t> prompt = Prompt(&rng, 7);
  BurstParams p;
  p.adjust = Controls(vocab_)[1];
  p.adjust.min_tokens = 30;
  p.adjust.stop_ids = {0};
  p.stop_ids = {0};
  p.k = 3;
  constexpr int kNew = 30;
  const std::vector<int32_t> want = Reference(model_.get(), prompt, p, kNew);
  auto s = engine.Admit("a", kCapacity, prompt).value();
  std::vector<int32_t> out;
  auto emit = [&](absl::Span<const int32_t> t) {
    out.insert(out.end(), t.begin(), t.end());
    return true;
  };
  p.max_new = 9;
  ASSERT_TRUE(engine.RunBurst(s.get(), p, emit).ok());
  std::vector<int32_t> history = prompt;
  history.insert(history.end(), out.begin(), out.end());
  s = engine.Admit("rebuilt", kCapacity, history).value();
  while (static_cast<int>(out.size()) < kNew) {
    p.prior_output = static_cast<int>(out.size());
    ASSERT_TRUE(engine.RunBurst(s.get(), p, emit).ok());
  }
  out.resize(kNew);
  if (!backend_->ExactPrefill()) {
    GTEST_SKIP() << "a rebuild's prefill is within the prefill tolerance";
  }
  EXPECT_EQ(out, want);
}

// Concurrent sessions, adjusted and not, greedy and sampled: grouped
// rounds give each the tokens it gets alone.
TEST_P(SpecAdjustTest, GroupedRoundsWithAndWithoutControls) {
  if (!model_->has_mtp()) GTEST_SKIP() << "no MTP head";
  constexpr int kSessions = 6;
  std::mt19937 rng(43);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<BurstParams> params;
  const std::vector<LogitAdjustments> controls = Controls(vocab_);
  for (int i = 0; i < kSessions; ++i) {
    prompts.push_back(Prompt(&rng, 4 + i));
    BurstParams p;
    p.k = 1 + i % 4;
    if (i % 3 != 2) p.adjust = controls[i % controls.size()];
    if (i % 2 == 1) {
      p.sampling.temperature = 0.9f;
      p.seed = 50 + i;
    }
    params.push_back(p);
  }
  auto run = [&](SpecEngine* engine, int i) {
    return EngineRun(engine, prompts[i], params[i], 20, {6}, false);
  };
  ModelExecutor shared_executor(model_.get());
  SpecEngine shared(&shared_executor);
  std::vector<std::vector<int32_t>> together(kSessions);
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < kSessions; ++i) {
      threads.emplace_back([&, i] { together[i] = run(&shared, i); });
    }
    for (auto& t : threads) t.join();
  }
  for (int i = 0; i < kSessions; ++i) {
    EXPECT_EQ(together[i], Reference(model_.get(), prompts[i], params[i], 20))
        << "session " << i;
  }
  EXPECT_GT(shared_executor.stats().grouped, 0u);
}

// Bad controls are refused before the burst touches the session, which
// then serves a good burst as if the bad one never came.
TEST_P(SpecAdjustTest, BadControlsRefusedSessionStillWorks) {
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(47);
  const std::vector<int32_t> prompt = Prompt(&rng, 6);
  BurstParams good;
  good.k = 2;
  good.max_new = 10;
  good.adjust = Controls(vocab_)[0];
  const std::vector<int32_t> want = Reference(model_.get(), prompt, good, 10);
  auto s = engine.Admit("b", kCapacity, prompt).value();
  std::vector<BurstParams> bad(5, good);
  bad[0].adjust.logit_bias = {{vocab_, 1.0f}};
  bad[1].adjust.presence_penalty = 2.5f;
  bad[2].adjust.repetition_penalty = -1.0f;
  bad[3].prior_output = 1000;  // more than the history holds
  bad[4].prior_output = 1;
  bad[4].suffix = {1, 2};  // a new turn has no prior output
  for (const BurstParams& p : bad) {
    absl::StatusOr<BurstResult> r =
        engine.RunBurst(s.get(), p, [](absl::Span<const int32_t>) {
          ADD_FAILURE() << "a refused burst emitted";
          return true;
        });
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
        << r.status();
  }
  std::vector<int32_t> got;
  ASSERT_TRUE(engine
                  .RunBurst(s.get(), good,
                            [&](absl::Span<const int32_t> t) {
                              got.insert(got.end(), t.begin(), t.end());
                              return true;
                            })
                  .ok());
  got.resize(10);
  EXPECT_EQ(got, want);
}

INSTANTIATE_TEST_SUITE_P(Models, SpecAdjustTest,
                         ::testing::ValuesIn(ModelDirs()),
                         model::testing::PathParamName);

}  // namespace
}  // namespace specserve::spec
