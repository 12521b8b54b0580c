// Property tests of structured output (worker/grammar) in the
// speculative-session engine, on the default model (the one with a
// tokenizer.json): for JSON schemas, a regex, an EBNF grammar, choices and
// any JSON object, the engine's output, plain (k = 0) and speculative
// (k = 1..6) over any burst lengths, equals a plain reference that decodes
// one token at a time and masks each row with a matcher fed the output
// before it; greedy and sampled, with the logit controls too. Every output
// is accepted by the grammar token by token, and one that ends early ends
// with the grammar complete. A session whose cursor is lost (a rebuild) and
// a rewind continue the same. spec_grammar_test on the CPU,
// spec_grammar_cuda_test on CUDA.
#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/forwarding_backend.h"
#include "kernels/sampling/logit_adjust.h"
#include "worker/grammar/grammar.h"
#include "worker/model/model.h"
#include "worker/model/test_backend.h"
#include "worker/model/test_data.h"
#include "worker/spec/spec_accept.h"
#include "worker/spec/spec_engine.h"

namespace specserve::spec {
namespace {

using grammar::CompiledGrammar;
using grammar::GrammarKind;
using grammar::GrammarMatcher;
using grammar::GrammarSpec;
using model::ForwardResult;
using model::Model;

constexpr int kCapacity = 512;

struct Outcome {
  std::vector<int32_t> tokens;
  bool complete = false;  // ended with the grammar's stop token
  bool operator==(const Outcome& o) const {
    return tokens == o.tokens && complete == o.complete;
  }
};

std::ostream& operator<<(std::ostream& os, const Outcome& o) {
  os << (o.complete ? "complete" : "open") << " [";
  for (int32_t t : o.tokens) os << t << " ";
  return os << "]";
}

// Plain decoding under the grammar (and p's logit controls), one token per
// step outside the engine: row i is adjusted from the history before it,
// then masked by a matcher that accepted the output before it; the pick is
// ChooseToken at i's uniform. Stops once the grammar accepts its stop
// token, or after n tokens.
Outcome Reference(Model* m, const CompiledGrammar& g,
                  const std::vector<int32_t>& prompt, const BurstParams& p,
                  int n) {
  const int V = m->config().vocab_size;
  model::StateOptions o;
  o.capacity = kCapacity;
  auto state = m->NewState(o).value();
  ForwardResult r;
  EXPECT_TRUE(m->Prefill(state.get(), prompt, {}, &r).ok());
  std::vector<float> row(r.logits.end() - V, r.logits.end());
  GrammarMatcher matcher = GrammarMatcher::Create(g).value();
  std::vector<int32_t> mask(matcher.bitmask_words());
  std::vector<int32_t> history = prompt;
  Outcome out;
  while (static_cast<int>(out.tokens.size()) < n) {
    const sampling::TokenCounts counts(history, prompt.size(), true);
    std::vector<float> raw = row;
    if (p.adjust.active()) {
      sampling::ApplyLogitAdjustments(p.adjust, counts, absl::MakeSpan(row));
    }
    EXPECT_GT(matcher.FillMask(absl::MakeSpan(mask)).value(), 0);
    grammar::ApplyBitmask(mask, absl::MakeSpan(row));
    if (std::all_of(row.begin(), row.end(),
                    [](float x) { return std::isinf(x); })) {
      row = raw;  // the grammar wins over min_tokens (RowControls)
      grammar::ApplyBitmask(mask, absl::MakeSpan(row));
    }
    const float u =
        p.sampling.greedy() ? 0.0f : PositionUniform(p.seed, history.size());
    const int32_t t = sampling::ChooseToken(row, p.sampling, u).value();
    out.tokens.push_back(t);
    EXPECT_TRUE(matcher.Accept(t)) << "reference chose a refused token " << t;
    if (matcher.IsTerminated()) {
      out.complete = true;
      break;
    }
    history.push_back(t);
    r = ForwardResult();
    EXPECT_TRUE(m->Decode(state.get(), t, &r).ok());
    row = r.logits;
  }
  return out;
}

// Whether a fresh matcher accepts every token of `o` and ends as `o` says.
bool FollowsTheGrammar(const CompiledGrammar& g, const Outcome& o) {
  GrammarMatcher m = GrammarMatcher::Create(g).value();
  for (int32_t t : o.tokens) {
    if (!m.Accept(t)) return false;
  }
  return m.IsTerminated() == o.complete;
}

class SpecGrammarTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    backend_ = model::testing::MakeTestBackend(&why);
    if (backend_ == nullptr) GTEST_SKIP() << why;
    const std::string dir = model::testing::DefaultModelDir();
    auto loaded = Model::Load(dir, backend_.get());
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    model_ = std::move(*loaded);
    auto compiler = grammar::GrammarCompiler::FromModelDir(dir);
    ASSERT_TRUE(compiler.ok()) << compiler.status();
    compiler_ = std::move(*compiler);
    vocab_ = model_->config().vocab_size;
  }

  CompiledGrammar Compile(const GrammarSpec& spec) {
    auto g = compiler_->Compile(spec);
    EXPECT_TRUE(g.ok()) << g.status();
    return *g;
  }

  // Schemas, a regex, an EBNF grammar, choices and any object: short
  // matches, so that most runs end with the grammar complete.
  std::vector<CompiledGrammar> Grammars() {
    std::vector<GrammarSpec> specs = {
        {GrammarKind::kJsonSchema,
         R"({"type": "object", "properties": {"ok": {"type": "boolean"},
             "n": {"type": "integer", "minimum": 0, "maximum": 9}},
             "required": ["ok", "n"], "additionalProperties": false})"},
        {GrammarKind::kJsonSchema,
         R"({"type": "array", "items": {"enum": ["a", "b", "c"]},
             "minItems": 1, "maxItems": 3})"},
        {GrammarKind::kRegex, "(yes|no), [0-9]{1,3}\\."},
        {GrammarKind::kEbnf, "root ::= \"(\" [a-z]+ (\",\" [a-z]+)* \")\""},
        {GrammarKind::kChoice, "", {"red", "green", "blue sky"}},
        {GrammarKind::kJsonObject, ""},
    };
    std::vector<CompiledGrammar> out;
    for (const GrammarSpec& s : specs) out.push_back(Compile(s));
    return out;
  }

  // The engine's output for one request of up to n tokens in bursts of the
  // given lengths (cycled), its prompt as the first burst's suffix.
  // `lose_cursor`: the session forgets its grammar position between bursts
  // (as a rebuilt copy has none), so each burst rebuilds it.
  // Cut after the token that completes the grammar (a round may emit
  // tokens past a stop token; the scheduler shows none of them).
  Outcome EngineRun(SpecEngine* engine, const std::vector<int32_t>& prompt,
                    BurstParams p, int n, const std::vector<int>& bursts,
                    bool lose_cursor = false, const std::string& id = "s") {
    auto s = engine->Admit(id, kCapacity, {}).value();
    bool stopped = false;
    Outcome out;
    for (size_t i = 0; static_cast<int>(out.tokens.size()) < n; ++i) {
      BurstParams q = p;
      q.max_new = std::min(bursts[i % bursts.size()],
                           n - static_cast<int>(out.tokens.size()));
      q.max_emit = n - static_cast<int>(out.tokens.size());
      q.prior_output = static_cast<int>(out.tokens.size());
      if (i == 0) q.suffix = prompt;
      if (lose_cursor) s->grammar_cursor.reset();
      absl::StatusOr<BurstResult> r =
          engine->RunBurst(s.get(), q, [&](absl::Span<const int32_t> t) {
            out.tokens.insert(out.tokens.end(), t.begin(), t.end());
            return true;
          });
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) break;
      if (r->end == BurstEnd::kStopToken) {
        stopped = true;
        break;
      }
    }
    if (p.grammar) {
      GrammarMatcher m = GrammarMatcher::Create(*p.grammar).value();
      for (size_t i = 0; i < out.tokens.size() && m.Accept(out.tokens[i]);
           ++i) {
        if (m.IsTerminated()) {
          out.tokens.resize(i + 1);
          out.complete = true;
        }
      }
    }
    EXPECT_EQ(stopped, out.complete) << "a burst ended at a stop token but "
                                        "the grammar was not complete, or "
                                        "the reverse";
    return out;
  }

  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<grammar::GrammarCompiler> compiler_;
  int vocab_ = 0;
};

TEST_F(SpecGrammarTest, GreedySpecEqualsPlainUnderEveryGrammar) {
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(11);
  constexpr int kNew = 40;
  int complete = 0;
  for (const CompiledGrammar& g : Grammars()) {
    for (int trial = 0; trial < 2; ++trial) {
      const std::vector<int32_t> prompt =
          model::testing::RandomTokens(5 + 4 * trial, vocab_, &rng);
      BurstParams p;
      p.grammar = g;
      const Outcome want = Reference(model_.get(), g, prompt, p, kNew);
      EXPECT_TRUE(FollowsTheGrammar(g, want)) << want;
      complete += want.complete;
      for (int k : {0, 1, 2, 4, 6}) {
        p.k = k;
        const std::vector<int> bursts =
            k % 2 ? std::vector<int>{1, 5, 3} : std::vector<int>{32};
        EXPECT_EQ(EngineRun(&engine, prompt, p, kNew, bursts), want)
            << "grammar " << g.key().substr(0, 60) << " trial " << trial
            << " k " << k;
      }
    }
  }
  EXPECT_GT(complete, 0) << "no output completed its grammar";
}

TEST_F(SpecGrammarTest, SampledSpecEqualsPlainWithPenaltiesToo) {
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(23);
  constexpr int kNew = 36;
  const std::vector<CompiledGrammar> grammars = Grammars();
  for (size_t i = 0; i < grammars.size(); ++i) {
    const std::vector<int32_t> prompt =
        model::testing::RandomTokens(6, vocab_, &rng);
    BurstParams p;
    p.grammar = grammars[i];
    p.sampling = {i % 2 ? 1.0f : 0.8f, i == 2 ? 40 : 0, 1.0f, 0.0f};
    p.seed = 900 + i;
    if (i % 2 == 0) {
      p.adjust.frequency_penalty = 1.0f;
      p.adjust.repetition_penalty = 1.2f;
    }
    const Outcome want = Reference(model_.get(), grammars[i], prompt, p, kNew);
    EXPECT_TRUE(FollowsTheGrammar(grammars[i], want)) << want;
    for (int k : {0, 1, 3, 5}) {
      p.k = k;
      EXPECT_EQ(EngineRun(&engine, prompt, p, kNew, {4, 1, 7}), want)
          << "grammar " << i << " k " << k;
    }
  }
}

// min_tokens holds the stop token back while the grammar allows others; once
// the grammar allows only its stop token, the grammar wins.
TEST_F(SpecGrammarTest, MinTokensYieldsToACompleteGrammar) {
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(5);
  const CompiledGrammar g =
      Compile({GrammarKind::kChoice, "", {"red", "green"}});
  const std::vector<int32_t> prompt =
      model::testing::RandomTokens(6, vocab_, &rng);
  BurstParams p;
  p.grammar = g;
  p.adjust.min_tokens = 30;
  p.adjust.stop_ids = {};  // min_tokens' ids: every EOS of the model
  for (int id : model_->config().eos_token_ids) p.adjust.stop_ids.push_back(id);
  const Outcome want = Reference(model_.get(), g, prompt, p, 40);
  EXPECT_TRUE(want.complete) << want;
  for (int k : {0, 3}) {
    p.k = k;
    EXPECT_EQ(EngineRun(&engine, prompt, p, 40, {2, 5}), want) << "k " << k;
  }
}

// A session that lost its grammar position (a rebuilt copy) rebuilds it from
// the history at every burst and continues the same.
TEST_F(SpecGrammarTest, RebuiltCursorContinuesTheSame) {
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(31);
  for (const CompiledGrammar& g : Grammars()) {
    const std::vector<int32_t> prompt =
        model::testing::RandomTokens(7, vocab_, &rng);
    BurstParams p;
    p.grammar = g;
    p.k = 3;
    const Outcome want = EngineRun(&engine, prompt, p, 30, {2, 3});
    EXPECT_EQ(EngineRun(&engine, prompt, p, 30, {2, 3}, /*lose_cursor=*/true),
              want);
  }
}

// A rewind regenerates the turn from its checkpoint: the grammar starts
// again with it, and the output repeats.
TEST_F(SpecGrammarTest, RewindRestartsTheGrammar) {
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(41);
  const CompiledGrammar g = Grammars()[0];
  const std::vector<int32_t> prompt =
      model::testing::RandomTokens(6, vocab_, &rng);
  auto s = engine.Admit("r", kCapacity, {}).value();
  auto turn = [&](BurstParams q) {
    std::vector<int32_t> out;
    EXPECT_TRUE(engine
                    .RunBurst(s.get(), q,
                              [&](absl::Span<const int32_t> t) {
                                out.insert(out.end(), t.begin(), t.end());
                                return true;
                              })
                    .ok());
    return out;
  };
  BurstParams p;
  p.grammar = g;
  p.k = 2;
  p.max_new = 40;
  p.suffix = prompt;
  const std::vector<int32_t> first = turn(p);
  BurstParams again = p;
  again.suffix.clear();
  again.rewind = true;
  EXPECT_EQ(turn(again), first);
  ASSERT_TRUE(s->grammar_cursor.has_value());
  EXPECT_EQ(s->grammar_cursor->output_start(),
            static_cast<int64_t>(prompt.size()));
}

// Sessions with and without grammars, greedy and sampled, whose rounds group
// together: each gives what it gives alone.
TEST_F(SpecGrammarTest, GroupedRoundsWithAndWithoutGrammars) {
  const std::vector<CompiledGrammar> grammars = Grammars();
  std::mt19937 rng(53);
  constexpr int kSessions = 6;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<BurstParams> params;
  for (int i = 0; i < kSessions; ++i) {
    prompts.push_back(model::testing::RandomTokens(5 + i, vocab_, &rng));
    BurstParams p;
    if (i % 3 != 2) p.grammar = grammars[i % grammars.size()];
    if (i % 2) {
      p.sampling = {0.9f, 0, 1.0f, 0.0f};
      p.seed = 70 + i;
    }
    p.k = 1 + i % 4;
    params.push_back(p);
  }
  std::vector<Outcome> alone(kSessions), together(kSessions);
  {
    ModelExecutor executor(model_.get());
    SpecEngine engine(&executor);
    for (int i = 0; i < kSessions; ++i) {
      alone[i] = EngineRun(&engine, prompts[i], params[i], 28, {3, 4});
    }
  }
  ModelExecutor shared(model_.get());
  SpecEngine engine(&shared);
  std::vector<std::thread> threads;
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&, i] {
      together[i] = EngineRun(&engine, prompts[i], params[i], 28, {3, 4}, false,
                              "s" + std::to_string(i));
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kSessions; ++i) {
    EXPECT_EQ(together[i], alone[i]) << "session " << i;
    if (params[i].grammar) {
      EXPECT_TRUE(FollowsTheGrammar(*params[i].grammar, alone[i])) << alone[i];
    }
  }
}

// Counts the logits rows the model copies to the host (copies of at least
// one [V] row of floats).
class RowCopyCounter : public kernels::ForwardingBackend {
 public:
  RowCopyCounter(kernels::Backend* inner, int vocab)
      : ForwardingBackend(inner), row_bytes_(vocab * sizeof(float)) {}
  absl::Status CopyToHost(void* host_dst, const void* src,
                          size_t bytes) override {
    if (bytes >= row_bytes_) ++rows_copied_;
    return ForwardingBackend::CopyToHost(host_dst, src, bytes);
  }
  int rows_copied() const { return rows_copied_; }

 private:
  const size_t row_bytes_;
  std::atomic<int> rows_copied_{0};
};

// A grammar alone is masked on the backend: the same tokens as masking on
// the host, greedy and sampled, plain and speculative.
TEST_F(SpecGrammarTest, BackendMaskEqualsHostMask) {
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(61);
  const std::vector<CompiledGrammar> grammars = Grammars();
  for (size_t i = 0; i < grammars.size(); ++i) {
    const std::vector<int32_t> prompt =
        model::testing::RandomTokens(7, vocab_, &rng);
    for (bool sampled : {false, true}) {
      BurstParams p;
      p.grammar = grammars[i];
      if (sampled) {
        p.sampling = {0.9f, i % 3 == 1 ? 20 : 0, i % 3 == 2 ? 0.9f : 1.0f,
                      0.0f};
        p.seed = 300 + i;
      }
      for (int k : {0, 2, 4}) {
        p.k = k;
        p.grammar_on_host = true;
        const Outcome host = EngineRun(&engine, prompt, p, 30, {5, 2});
        p.grammar_on_host = false;
        EXPECT_EQ(EngineRun(&engine, prompt, p, 30, {5, 2}), host)
            << "grammar " << i << " sampled " << sampled << " k " << k;
        EXPECT_TRUE(FollowsTheGrammar(grammars[i], host)) << host;
      }
    }
  }
}

// What makes constrained decoding cost what plain does: masked on the
// backend, a greedy step copies no logits row to the host; masked on the
// host, every step copies its row.
TEST_F(SpecGrammarTest, BackendMaskCopiesNoLogitsRow) {
  RowCopyCounter counter(backend_.get(), vocab_);
  auto loaded = Model::Load(model::testing::DefaultModelDir(), &counter);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::unique_ptr<Model> model = std::move(*loaded);
  ModelExecutor executor(model.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(67);
  const std::vector<int32_t> prompt =
      model::testing::RandomTokens(6, vocab_, &rng);
  BurstParams p;
  p.grammar = Compile({GrammarKind::kJsonObject, ""});
  for (int k : {0, 3}) {
    p.k = k;
    for (bool on_host : {false, true}) {
      p.grammar_on_host = on_host;
      const int before = counter.rows_copied();
      const Outcome o = EngineRun(&engine, prompt, p, 16, {16});
      const int copied = counter.rows_copied() - before;
      // The prompt's last row comes back with the prefill (the first token
      // is chosen from it on the host); nothing else does on the backend.
      if (on_host) {
        EXPECT_GE(copied, static_cast<int>(o.tokens.size())) << "k " << k;
      } else {
        EXPECT_LE(copied, 1) << "k " << k;
      }
    }
  }
}

}  // namespace
}  // namespace specserve::spec
