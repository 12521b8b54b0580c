// Property tests of the speculative-session engine on real checkpoints (the
// tiny random models and the default model): greedy speculative output equals
// plain greedy token for token across random multi-turn scripts (k = 1..6,
// burst lengths 1, 2, 5, 32, suffixes, continuations, rewinds, demotion),
// the capacity edge for every k, sampled reproducibility and distribution,
// no solo passes on continuation, and telemetry deltas. On the backend the
// target links (worker/model/test_backend.h): spec_engine_test on the CPU,
// spec_engine_cuda_test on CUDA device 0 (the same properties on the GPU).
#include "worker/spec/spec_engine.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "worker/model/model.h"
#include "worker/model/test_backend.h"
#include "worker/model/test_data.h"

namespace specserve::spec {
namespace {

using model::ForwardResult;
using model::Model;

// Plain greedy decoding over a growing history: the oracle. It holds the
// caches of the whole history and the logits after its last token.
class PlainReference {
 public:
  PlainReference(Model* m, int capacity) : model_(m), capacity_(capacity) {}

  // Restarts from scratch on `history` (a from-scratch run).
  void Reset(const std::vector<int32_t>& history) {
    model::StateOptions o;
    o.capacity = capacity_;
    state_ = model_->NewState(o).value();
    history_.clear();
    Append(history);
  }
  void Append(const std::vector<int32_t>& tokens) {
    if (tokens.empty()) return;
    ForwardResult r;
    ASSERT_TRUE(model_->Prefill(state_.get(), tokens, {}, &r).ok());
    next_ = r.argmax.back();
    history_.insert(history_.end(), tokens.begin(), tokens.end());
  }
  // The next n greedy tokens, appended to the history.
  std::vector<int32_t> Generate(int n) {
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) {
      out.push_back(next_);
      ForwardResult r;
      EXPECT_TRUE(model_->Decode(state_.get(), next_, &r).ok());
      history_.push_back(next_);
      next_ = r.argmax[0];
    }
    return out;
  }
  const std::vector<int32_t>& history() const { return history_; }

 private:
  Model* model_;
  int capacity_;
  std::unique_ptr<model::ModelState> state_;
  std::vector<int32_t> history_;
  int32_t next_ = -1;
};

struct Collected {
  std::vector<int32_t> tokens;
  EmitFn fn() {
    return [this](absl::Span<const int32_t> t) {
      tokens.insert(tokens.end(), t.begin(), t.end());
      return true;
    };
  }
};

std::vector<int32_t> RandomTokens(std::mt19937* rng, int n, int vocab) {
  std::uniform_int_distribution<int> d(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(*rng);
  return t;
}

// The tiny random models (awkward shapes) and the trained default model
// (real acceptance, so full-accept rounds are exercised).
std::vector<std::string> ModelDirs() {
  std::vector<std::string> dirs = model::testing::TestModelDirs();
  dirs.push_back("models/specserve-tiny-py");  // models/default
  // Both KV cache types on every backend (the default is one of them).
  for (kernels::DType kv : {kernels::DType::kF32, kernels::DType::kBF16}) {
    dirs.push_back(model::testing::WithKvCache("tests/models/tiny_a", kv));
  }
  // A bf16 recurrent state (verify == decode holds in it too).
  dirs.push_back(model::testing::WithRecurrentState("tests/models/tiny_a",
                                                    kernels::DType::kBF16));
  return dirs;
}

class SpecEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    backend_ = model::testing::MakeTestBackend(
        &why, model::testing::KvCacheDTypeOf(GetParam()),
        model::testing::RecurrentStateDTypeOf(GetParam()));
    if (backend_ == nullptr) GTEST_SKIP() << why;
    auto loaded =
        Model::Load(model::testing::ModelDirOf(GetParam()), backend_.get());
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    model_ = std::move(*loaded);
    vocab_ = model_->config().vocab_size;
  }
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<Model> model_;
  int vocab_ = 0;
};

// Greedy speculative bursts == plain greedy, over random multi-turn scripts.
TEST_P(SpecEngineTest, GreedySpecEqualsPlainAcrossScripts) {
  constexpr int kCapacity = 512;
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(11);
  for (int k = 1; k <= 6; ++k) {
    for (int burst : {1, 2, 5, 32}) {
      SCOPED_TRACE("k=" + std::to_string(k) +
                   " burst=" + std::to_string(burst));
      std::vector<int32_t> prompt = RandomTokens(&rng, 3 + rng() % 12, vocab_);
      auto s = engine.Admit("s", kCapacity, prompt).value();
      PlainReference ref(model_.get(), kCapacity);
      ref.Reset(prompt);
      int checkpoint = static_cast<int>(prompt.size());
      bool demoted = false;
      std::vector<int32_t> last_prefix, last_tokens;
      for (int op = 0; op < 8; ++op) {
        BurstParams p;
        p.k = k;
        p.max_new = burst;
        const int choice = rng() % 11;
        if (choice == 10) {
          // Park (flush) and move the caches to host memory and back, as the
          // pool does under memory pressure; the stream must not notice.
          ASSERT_TRUE(engine.Flush(s.get()).ok());
          auto snap = model_->Offload(s->caches());
          ASSERT_TRUE(snap.ok()) << snap.status();
          ASSERT_TRUE(model_->Restore(s->caches(), **snap).ok());
        } else if (choice < 5) {
          // Empty-suffix continuation.
        } else if (choice < 8) {
          p.suffix = RandomTokens(&rng, 1 + rng() % 6, vocab_);
        } else if (choice < 9) {
          p.rewind = true;
          p.suffix = RandomTokens(&rng, 1 + rng() % 4, vocab_);
        } else if (!demoted) {
          ASSERT_TRUE(engine.Demote(s.get()).ok());
          demoted = true;
          // A demoted session keeps streaming plain decode and keeps its
          // prompt checkpoint for a later rewind.
        }
        if (s->committed_len() + 64 + static_cast<int>(p.suffix.size()) >
            kCapacity) {
          break;
        }
        Collected got;
        auto r = engine.RunBurst(s.get(), p, got.fn());
        ASSERT_TRUE(r.ok()) << r.status();
        if (p.rewind) {
          std::vector<int32_t> h(ref.history().begin(),
                                 ref.history().begin() + checkpoint);
          ref.Reset(h);
        }
        ref.Append(p.suffix);
        if (!p.suffix.empty()) {
          checkpoint = static_cast<int>(ref.history().size());
        }
        last_prefix = ref.history();
        const std::vector<int32_t> want = ref.Generate(got.tokens.size());
        ASSERT_EQ(got.tokens, want) << "op " << op;
        last_tokens = got.tokens;
        EXPECT_GE(r->produced, p.max_new);
        EXPECT_LE(r->overshoot, k);
        EXPECT_EQ(s->committed_len() + (s->has_pending() ? 1 : 0),
                  static_cast<int>(ref.history().size()));
      }
      // The last turn equals a from-scratch run over the same history.
      PlainReference fresh(model_.get(), kCapacity);
      fresh.Reset(last_prefix);
      EXPECT_EQ(fresh.Generate(last_tokens.size()), last_tokens);
    }
  }
}

// Never write past capacity: with the capacity exactly at the edge, every k
// ends CONTEXT_FULL with every emitted token committable.
TEST_P(SpecEngineTest, CapacityEdgeForEveryK) {
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(5);
  for (int k = 0; k <= 6; ++k) {
    for (int slack = 0; slack <= 9; ++slack) {
      std::vector<int32_t> prompt = RandomTokens(&rng, 6, vocab_);
      const int capacity = 6 + slack;
      auto s = engine.Admit("edge", capacity, prompt).value();
      BurstParams p;
      p.k = k;
      p.max_new = 1000;
      Collected got;
      auto r = engine.RunBurst(s.get(), p, got.fn());
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->end, BurstEnd::kCapacity);
      EXPECT_LE(s->committed_len() + (s->has_pending() ? 1 : 0), capacity);
      // Everything emitted fits: flushing commits the pending token.
      ASSERT_TRUE(engine.Flush(s.get()).ok());
      EXPECT_LE(s->committed_len(), capacity);
      PlainReference ref(model_.get(), capacity);
      ref.Reset(prompt);
      EXPECT_EQ(got.tokens, ref.Generate(got.tokens.size()));
    }
  }
}

// A continuation burst after a round runs one trunk pass per round: the
// carried pending token rides in verify column 0 (no solo passes).
TEST_P(SpecEngineTest, ContinuationRunsNoSoloPass) {
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(9);
  auto s = engine.Admit("c", 256, RandomTokens(&rng, 8, vocab_)).value();
  BurstParams p;
  p.k = 3;
  p.max_new = 6;
  Collected got;
  ASSERT_TRUE(engine.RunBurst(s.get(), p, got.fn()).ok());
  ASSERT_TRUE(s->has_pending());
  const int64_t passes = engine.trunk_passes();
  const uint64_t rounds = s->telem.rounds;
  ASSERT_TRUE(engine.RunBurst(s.get(), p, got.fn()).ok());
  EXPECT_EQ(engine.trunk_passes() - passes,
            static_cast<int64_t>(s->telem.rounds - rounds));
}

// Plain steps on a session that can draft owe their MTP rows and write them
// in one pass at the burst's end: speculative rounds after plain bursts draft
// exactly as on a session whose whole history was prefilled (same drafts,
// same acceptance), and every token equals plain greedy.
TEST_P(SpecEngineTest, PlainStepsDeferTheirMtpRowsExactly) {
  constexpr int kCapacity = 512;
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(31);
  const std::vector<int32_t> prompt = RandomTokens(&rng, 10, vocab_);
  auto a = engine.Admit("a", kCapacity, prompt).value();
  if (!a->can_draft()) GTEST_SKIP() << "no MTP head";
  BurstParams plain;
  plain.k = 0;
  Collected before;
  for (int n : {20, 1, 7}) {
    plain.max_new = n;
    ASSERT_TRUE(engine.RunBurst(a.get(), plain, before.fn()).ok());
    EXPECT_TRUE(a->deferred_mtp().empty()) << "owed rows past the burst";
  }
  ASSERT_TRUE(engine.Flush(a.get()).ok());
  auto b = engine.Admit("b", kCapacity, a->committed).value();
  BurstParams spec;
  spec.k = 3;
  spec.max_new = 24;
  Collected ga, gb;
  ASSERT_TRUE(engine.RunBurst(a.get(), spec, ga.fn()).ok());
  ASSERT_TRUE(engine.RunBurst(b.get(), spec, gb.fn()).ok());
  EXPECT_EQ(ga.tokens, gb.tokens);
  EXPECT_GT(a->telem.rounds, 0u);
  EXPECT_EQ(a->telem.drafted, b->telem.drafted);
  EXPECT_EQ(a->telem.accepted, b->telem.accepted);
  EXPECT_EQ(a->telem.accepted_per_position, b->telem.accepted_per_position);
  PlainReference ref(model_.get(), kCapacity);
  ref.Reset(prompt);
  std::vector<int32_t> got = before.tokens;
  got.insert(got.end(), ga.tokens.begin(), ga.tokens.end());
  EXPECT_EQ(got, ref.Generate(static_cast<int>(got.size())));
}

// Draft state sized for a depth: the verify captures hold depth + 1
// columns, and a burst asking for more drafts (within kMaxDraftDepth) runs
// rounds at that depth, still equal to plain greedy.
TEST_P(SpecEngineTest, DraftStateSizedForItsDepth) {
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(41);
  const std::vector<int32_t> prompt = RandomTokens(&rng, 9, vocab_);
  auto s = engine.Admit("d", 256, prompt, std::nullopt, true, 2).value();
  if (!s->can_draft()) GTEST_SKIP() << "no MTP head";
  EXPECT_EQ(s->caches()->max_verify_columns(), 3);
  BurstParams p;
  p.k = 5;
  p.max_new = 30;
  Collected got;
  ASSERT_TRUE(engine.RunBurst(s.get(), p, got.fn()).ok());
  ASSERT_GT(s->telem.rounds, 0u);
  EXPECT_EQ(s->telem.drafted, 2 * s->telem.rounds);
  PlainReference ref(model_.get(), 256);
  ref.Reset(prompt);
  EXPECT_EQ(got.tokens, ref.Generate(static_cast<int>(got.tokens.size())));
  auto full = engine.Admit("f", 256, prompt).value();
  EXPECT_EQ(full->caches()->max_verify_columns(), kMaxDraftDepth + 1);
  // A depth outside 1..kMaxDraftDepth is refused, not clamped.
  for (int depth : {0, kMaxDraftDepth + 1}) {
    EXPECT_EQ(engine.Admit("x", 256, prompt, std::nullopt, true, depth)
                  .status()
                  .code(),
              absl::StatusCode::kInvalidArgument)
        << depth;
  }
}

// max_emit (a one-shot request's last bursts): the burst ends with exactly
// that many tokens, greedy or sampled, the same tokens a burst without it
// begins with, and the session holds exactly what was emitted (no
// overshoot row), whatever k.
TEST_P(SpecEngineTest, MaxEmitEndsTheBurstExactly) {
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(43);
  const std::vector<int32_t> prompt = RandomTokens(&rng, 9, vocab_);
  for (bool sampled : {false, true}) {
    for (int k : {2, 4, kMaxDraftDepth}) {
      BurstParams p;
      p.k = k;
      p.max_new = 24;
      p.seed = 99;
      if (sampled) p.sampling = {0.8f, 0, 0.95f, 0.0f};
      auto free_run = engine.Admit("free", 256, prompt).value();
      Collected all;
      ASSERT_TRUE(engine.RunBurst(free_run.get(), p, all.fn()).ok());
      for (int n = 1; n <= 13; n += 3) {
        auto s = engine.Admit("capped", 256, prompt).value();
        p.max_new = n;
        p.max_emit = n;
        Collected got;
        absl::StatusOr<BurstResult> r = engine.RunBurst(s.get(), p, got.fn());
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(r->produced, n) << "k " << k << " sampled " << sampled;
        EXPECT_EQ(r->overshoot, 0);
        ASSERT_EQ(got.tokens.size(), static_cast<size_t>(n));
        EXPECT_EQ(got.tokens, std::vector<int32_t>(all.tokens.begin(),
                                                   all.tokens.begin() + n));
        // Committed plus the carried pending token: the prompt and the
        // emitted tokens, nothing past them.
        EXPECT_EQ(s->committed_len() + (s->has_pending() ? 1 : 0),
                  static_cast<int>(prompt.size()) + n);
        p.max_emit.reset();
      }
    }
  }
}

TEST_P(SpecEngineTest, SampledSameSeedSameOutput) {
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(21);
  const std::vector<int32_t> prompt = RandomTokens(&rng, 7, vocab_);
  std::vector<std::vector<int32_t>> runs;
  for (int rep = 0; rep < 2; ++rep) {
    auto s = engine.Admit("r", 256, prompt).value();
    BurstParams p;
    p.k = 3;
    p.max_new = 12;
    p.sampling = {0.8f, 0, 0.95f, 0.0f};
    p.seed = 1234;
    Collected got;
    for (int burst = 0; burst < 2; ++burst) {
      auto r = engine.RunBurst(s.get(), p, got.fn());
      ASSERT_TRUE(r.ok()) << r.status();
    }
    runs.push_back(got.tokens);
  }
  EXPECT_EQ(runs[0], runs[1]);
}

// Sampled output is a function of (seed, history): speculative with any k,
// any burst lengths, a demotion to plain decode midway, or a rebuild from the
// history on a fresh session give the tokens of one plain sampled run.
TEST_P(SpecEngineTest, SampledOutputIgnoresSplitsDemotionAndRebuild) {
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(57);
  constexpr int kNew = 24;
  for (int trial = 0; trial < 6; ++trial) {
    const std::vector<int32_t> prompt = RandomTokens(&rng, 3 + trial, vocab_);
    BurstParams p;
    p.sampling = {trial % 2 ? 1.0f : 0.7f, trial % 3 == 2 ? 20 : 0,
                  trial % 3 == 1 ? 0.9f : 1.0f, 0.0f};
    p.seed = 4242 + trial;
    // The reference: plain sampled decoding in one burst.
    std::vector<int32_t> want;
    {
      auto s = engine.Admit("ref", 128, prompt).value();
      BurstParams q = p;
      q.k = 0;
      q.max_new = kNew;
      Collected got;
      ASSERT_TRUE(engine.RunBurst(s.get(), q, got.fn()).ok());
      want = got.tokens;
      want.resize(kNew);
    }
    for (int schedule = 0; schedule < 4; ++schedule) {
      auto s = engine.Admit("s", 128, prompt).value();
      std::vector<int32_t> history = prompt;
      Collected got;
      bool rebuilt = false;
      size_t rebuilt_at = 0;  // tokens sent before the rebuild
      const int k = 1 + (trial + schedule) % 4;
      while (static_cast<int>(got.tokens.size()) < kNew) {
        BurstParams q = p;
        q.k = k;
        q.max_new = std::uniform_int_distribution<int>(1, 7)(rng);
        const size_t before = got.tokens.size();
        ASSERT_TRUE(engine.RunBurst(s.get(), q, got.fn()).ok());
        history.insert(history.end(), got.tokens.begin() + before,
                       got.tokens.end());
        if (schedule == 1 && got.tokens.size() >= kNew / 3 &&
            s->mode() == DecodeMode::kSpeculative) {
          ASSERT_TRUE(engine.Demote(s.get()).ok());
        }
        if (schedule == 2 && !rebuilt && got.tokens.size() >= kNew / 2) {
          rebuilt = true;
          rebuilt_at = got.tokens.size();
          // Rebuilt from the history the client was sent, as after a lost
          // worker: a fresh session prefilled with it.
          s = engine.Admit("rebuilt", 128, history).value();
        }
      }
      got.tokens.resize(kNew);
      std::vector<int32_t> expected = want;
      if (rebuilt && !backend_->ExactPrefill()) {
        // A rebuild's prefill is within the prefill tolerance of the
        // original decode, not equal to it (docs/DESIGN.md "Prefill
        // tolerance"): sampled tokens may part after it, never before.
        got.tokens.resize(rebuilt_at);
        expected.resize(rebuilt_at);
      }
      EXPECT_EQ(got.tokens, expected)
          << "trial " << trial << " schedule " << schedule << " k " << k;
    }
  }
}

// Chi-square critical value at significance 0.01 (Wilson–Hilferty).
double ChiSquareCritical01(int dof) {
  const double z = 2.3263478740408408;
  const double a = 2.0 / (9.0 * dof);
  return dof * std::pow(1.0 - a + z * std::sqrt(a), 3);
}

// Two-sample chi-square on the first three tokens: speculative sampling and
// plain sampling draw from the same distribution.
TEST_P(SpecEngineTest, SampledDistributionMatchesPlain) {
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(33);
  const std::vector<int32_t> prompt = RandomTokens(&rng, 5, vocab_);
  // SPEC_CHI_SEEDS overrides the count for longer runs by hand.
  const int kSeeds = std::getenv("SPEC_CHI_SEEDS")
                         ? std::atoi(std::getenv("SPEC_CHI_SEEDS"))
                         : 2000;
  for (float temperature : {0.7f, 1.3f}) {
    std::map<std::vector<int32_t>, int> spec_counts, plain_counts;
    for (int seed = 1; seed <= kSeeds; ++seed) {
      for (int k : {3, 0}) {
        auto s = engine.Admit("d", 64, prompt).value();
        BurstParams p;
        p.k = k;
        p.max_new = 3;
        p.sampling = {temperature, 0, 0.9f, 0.0f};
        p.seed = seed * 7919ull + (k == 0 ? 1000003ull : 0ull);
        Collected got;
        ASSERT_TRUE(engine.RunBurst(s.get(), p, got.fn()).ok());
        got.tokens.resize(3);
        (k ? spec_counts : plain_counts)[got.tokens]++;
      }
    }
    // Pool rare outcomes so every cell's expected count is >= 10 per sample
    // (the chi-square approximation inflates the statistic for thin cells).
    std::map<std::vector<int32_t>, std::pair<int, int>> cells;
    std::pair<int, int> rare{0, 0};
    for (auto& [key, c] : spec_counts) cells[key].first = c;
    for (auto& [key, c] : plain_counts) cells[key].second = c;
    double chi2 = 0;
    int dof = -1;
    auto add = [&](std::pair<int, int> c) {
      const double total = c.first + c.second;
      const double e = total / 2;  // equal sample sizes
      chi2 += (c.first - e) * (c.first - e) / e +
              (c.second - e) * (c.second - e) / e;
      ++dof;
    };
    for (auto& [key, c] : cells) {
      if (c.first + c.second < 20) {
        rare.first += c.first;
        rare.second += c.second;
      } else {
        add(c);
      }
    }
    if (rare.first + rare.second > 0) add(rare);
    if (dof < 1) continue;  // a near-deterministic model: nothing to compare
    std::printf("chi2 %.1f dof %d critical(0.01) %.1f temperature %.1f\n", chi2,
                dof, ChiSquareCritical01(dof), temperature);
    EXPECT_LT(chi2, ChiSquareCritical01(dof)) << "temperature " << temperature;
  }
}

TEST_P(SpecEngineTest, TelemetryDeltasSumToTotals) {
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(4);
  auto s = engine.Admit("t", 256, RandomTokens(&rng, 6, vocab_)).value();
  SpecTelemetry sum;
  for (int i = 0; i < 5; ++i) {
    BurstParams p;
    p.k = 1 + i % 4;
    p.max_new = 7;
    Collected got;
    auto r = engine.RunBurst(s.get(), p, got.fn());
    ASSERT_TRUE(r.ok());
    sum.rounds += r->telemetry_delta.rounds;
    sum.drafted += r->telemetry_delta.drafted;
    sum.accepted += r->telemetry_delta.accepted;
  }
  EXPECT_EQ(sum.rounds, s->telem.rounds);
  EXPECT_EQ(sum.drafted, s->telem.drafted);
  EXPECT_EQ(sum.accepted, s->telem.accepted);
}

TEST(SpecSessionTest, GraphFallbackResetOnResumeOnlyWhenSet) {
  kernels::cpu::CpuBackend backend;
  auto m =
      Model::Load(model::testing::RepoPath("tests/models/tiny_a"), &backend);
  ASSERT_TRUE(m.ok());
  SpecSession s("g", (*m)->NewState({}).value(), true);
  EXPECT_FALSE(s.reset_graph_fallback_on_resume());  // nothing set: silent
  s.set_graph_fallback();
  EXPECT_TRUE(s.graph_fallback());
  EXPECT_TRUE(s.reset_graph_fallback_on_resume());
  EXPECT_FALSE(s.graph_fallback());
  EXPECT_FALSE(s.reset_graph_fallback_on_resume());
}

TEST_P(SpecEngineTest, NanLogitsFailTheBurst) {
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(8);
  for (int at : {1, 2, 5}) {
    auto s = engine.Admit("n", 256, RandomTokens(&rng, 6, vocab_)).value();
    BurstParams p;
    p.k = 2;
    p.max_new = 10;
    p.inject_nan_at = at;
    Collected got;
    auto r = engine.RunBurst(s.get(), p, got.fn());
    EXPECT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("non-finite"), std::string::npos);
  }
}

// Concurrent plain steps batched by the executor, half of them without
// logits (greedy): every caller gets what it asked for, equal to its step
// run alone.
TEST_P(SpecEngineTest, ExecutorBatchesStepsWithAndWithoutLogits) {
  ModelExecutor executor(model_.get());
  constexpr int kSessions = 6;
  std::mt19937 rng(11);
  std::vector<std::unique_ptr<model::ModelState>> batched, alone;
  std::vector<int32_t> tokens;
  for (int i = 0; i < kSessions; ++i) {
    const std::vector<int32_t> prompt = RandomTokens(&rng, 3 + i, vocab_);
    for (auto* v : {&batched, &alone}) {
      v->push_back(model_->NewState({.capacity = 64}).value());
      model::ForwardResult r;
      ASSERT_TRUE(model_->Prefill(v->back().get(), prompt, {}, &r).ok());
    }
    tokens.push_back(RandomTokens(&rng, 1, vocab_)[0]);
  }
  std::vector<model::ForwardResult> got(kSessions);
  std::vector<absl::Status> status(kSessions);
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < kSessions; ++i) {
      got[i].want_logits = i % 2 == 0;
      threads.emplace_back([&, i] {
        status[i] = executor.Decode(batched[i].get(), tokens[i], &got[i]);
      });
    }
    for (auto& t : threads) t.join();
  }
  for (int i = 0; i < kSessions; ++i) {
    ASSERT_TRUE(status[i].ok()) << status[i];
    model::ForwardResult want;
    ASSERT_TRUE(model_->Decode(alone[i].get(), tokens[i], &want).ok());
    EXPECT_EQ(got[i].argmax, want.argmax) << "session " << i;
    EXPECT_EQ(got[i].hidden, want.hidden) << "session " << i;
    EXPECT_EQ(got[i].finite, std::vector<int32_t>{1}) << "session " << i;
    if (got[i].want_logits) {
      EXPECT_EQ(got[i].logits, want.logits) << "session " << i;
    } else {
      EXPECT_TRUE(got[i].logits.empty()) << "session " << i;
    }
  }
}

// Speculative sessions on one engine at once (greedy and sampled, a
// different k each, several bursts): their rounds are grouped into
// shared passes, and every session's tokens equal the same session run
// alone on a fresh engine.
TEST_P(SpecEngineTest, ConcurrentRoundsShareVerifyPassesExactly) {
  constexpr int kSessions = 5;
  constexpr int kCapacity = 256;
  std::mt19937 rng(57);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<BurstParams> params;
  for (int i = 0; i < kSessions; ++i) {
    prompts.push_back(RandomTokens(&rng, 4 + i, vocab_));
    BurstParams p;
    p.k = 1 + i % 4;
    p.max_new = 9;
    if (i % 2 == 1) {
      p.sampling.temperature = 0.8f;
      p.seed = 100 + i;
    }
    params.push_back(p);
  }
  auto run = [&](SpecEngine* engine, int i, std::vector<int32_t>* out) {
    auto s = engine->Admit("s" + std::to_string(i), kCapacity, prompts[i]);
    ASSERT_TRUE(s.ok()) << s.status();
    if (!(*s)->can_draft()) return;
    for (int burst = 0; burst < 4; ++burst) {
      Collected got;
      auto r = engine->RunBurst(s->get(), params[i], got.fn());
      ASSERT_TRUE(r.ok()) << r.status();
      out->insert(out->end(), got.tokens.begin(), got.tokens.end());
    }
  };
  ModelExecutor shared_executor(model_.get());
  SpecEngine shared(&shared_executor);
  std::vector<std::vector<int32_t>> together(kSessions);
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < kSessions; ++i) {
      threads.emplace_back([&, i] { run(&shared, i, &together[i]); });
    }
    for (auto& t : threads) t.join();
  }
  if (together[0].empty()) GTEST_SKIP() << "no MTP head";
  for (int i = 0; i < kSessions; ++i) {
    ModelExecutor executor(model_.get());
    SpecEngine alone(&executor);
    std::vector<int32_t> want;
    run(&alone, i, &want);
    EXPECT_EQ(together[i], want) << "session " << i;
  }
  EXPECT_GT(shared_executor.stats().grouped, 0u);
}

// Runs call(0..n-1), each on its own thread, while the model is held: the
// first caller to reach the executor leads and waits for the model, the
// others queue behind it, so one pass carries them all. The sleep only
// gives the threads time to queue; the tests assert on what ran.
std::vector<absl::Status> CallWhileModelHeld(
    ModelExecutor* executor, int n,
    const std::function<absl::Status(int)>& call) {
  std::vector<absl::Status> status(n);
  std::vector<std::thread> threads;
  EXPECT_TRUE(executor
                  ->Exclusive([&] {
                    for (int i = 0; i < n; ++i) {
                      threads.emplace_back([&, i] { status[i] = call(i); });
                    }
                    std::this_thread::sleep_for(std::chrono::milliseconds(300));
                    return absl::OkStatus();
                  })
                  .ok());
  for (auto& t : threads) t.join();
  return status;
}

// Rounds queued while the model is busy run as one group (shared draft,
// verify and accept passes: round_group.cc), greedy and sampled sessions
// with different k together, each session's tokens equal to its bursts
// alone.
TEST_P(SpecEngineTest, ExecutorGroupsQueuedRounds) {
  if (!model_->has_mtp()) GTEST_SKIP() << "no MTP head";
  constexpr int kSessions = 6;
  std::mt19937 rng(23);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<BurstParams> params;
  for (int i = 0; i < kSessions; ++i) {
    prompts.push_back(RandomTokens(&rng, 3 + 2 * i, vocab_));
    BurstParams p;
    p.k = 1 + i % 4;
    p.max_new = 7;
    if (i % 3 == 2) {
      p.sampling.temperature = 0.9f;
      p.seed = 300 + i;
    }
    params.push_back(p);
  }
  auto admit = [&](SpecEngine* engine, int i) {
    return engine->Admit("g" + std::to_string(i), 128, prompts[i]).value();
  };
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::vector<std::unique_ptr<SpecSession>> sessions;
  for (int i = 0; i < kSessions; ++i) sessions.push_back(admit(&engine, i));
  std::vector<Collected> got(kSessions);
  const ModelExecutor::Stats before = executor.stats();
  const std::vector<absl::Status> status =
      CallWhileModelHeld(&executor, kSessions, [&](int i) {
        return engine.RunBurst(sessions[i].get(), params[i], got[i].fn())
            .status();
      });
  const ModelExecutor::Stats after = executor.stats();
  for (int i = 0; i < kSessions; ++i) {
    ASSERT_TRUE(status[i].ok()) << status[i];
    ModelExecutor alone_executor(model_.get());
    SpecEngine alone(&alone_executor);
    auto s = admit(&alone, i);
    Collected want;
    ASSERT_TRUE(alone.RunBurst(s.get(), params[i], want.fn()).ok());
    EXPECT_EQ(got[i].tokens, want.tokens) << "session " << i;
  }
  EXPECT_LT(after.groups - before.groups, after.grouped - before.grouped)
      << "no two rounds ran in one group";
}

INSTANTIATE_TEST_SUITE_P(Models, SpecEngineTest,
                         ::testing::ValuesIn(ModelDirs()),
                         model::testing::PathParamName);

}  // namespace
}  // namespace specserve::spec
