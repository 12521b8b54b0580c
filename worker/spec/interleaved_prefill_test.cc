// A long prompt is prefilled in chunks (SpecEngine::AppendInChunks through
// ModelExecutor::Interleaved): a session streaming meanwhile steps between
// the chunks instead of waiting for the whole prompt, and the prompted
// session's tokens are bit-identical to its run alone, plain and
// speculative, with and without prompt logprobs.
#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/model.h"
#include "worker/model/test_backend.h"
#include "worker/model/test_data.h"
#include "worker/spec/model_executor.h"
#include "worker/spec/spec_engine.h"

namespace specserve::spec {
namespace {

constexpr int kCapacity = 1024;

class InterleavedPrefillTest : public ::testing::TestWithParam<std::string> {
 public:
  struct Turn {
    std::vector<int32_t> tokens;
    std::vector<TokenLogprobs> prompt_logprobs;
  };

 protected:
  void SetUp() override {
    std::string why;
    backend_ = model::testing::MakeTestBackend(&why);
    if (backend_ == nullptr) GTEST_SKIP() << why;
    auto loaded = model::Model::Load(model::testing::ModelDirOf(GetParam()),
                                     backend_.get());
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    model_ = std::move(*loaded);
  }

  std::vector<int32_t> RandomTokens(std::mt19937* rng, int n) {
    std::uniform_int_distribution<int> d(0, model_->config().vocab_size - 1);
    std::vector<int32_t> t(n);
    for (auto& x : t) x = d(*rng);
    return t;
  }

  // A session admitted with `history`, then one turn of `suffix` with
  // `max_new` tokens at draft depth k, on `engine`.
  static Turn RunTurn(SpecEngine* engine, const std::string& id,
                      const std::vector<int32_t>& history,
                      const std::vector<int32_t>& suffix, int k, int max_new,
                      const std::function<void()>& on_first_token = {}) {
    Turn turn;
    auto s = engine->Admit(id, kCapacity, history, std::nullopt, k > 0);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return turn;
    BurstParams p;
    p.suffix = suffix;
    p.k = k;
    p.max_new = max_new;
    p.prompt_logprobs = 3;
    auto r = engine->RunBurst(
        s->get(), p,
        [&](absl::Span<const int32_t> t, absl::Span<const TokenLogprobs>) {
          if (turn.tokens.empty() && on_first_token) on_first_token();
          turn.tokens.insert(turn.tokens.end(), t.begin(), t.end());
          return true;
        });
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) turn.prompt_logprobs = r->prompt_logprobs;
    return turn;
  }

  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::Model> model_;
};

void ExpectSameTurn(const InterleavedPrefillTest::Turn& got,
                    const InterleavedPrefillTest::Turn& want) {
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.prompt_logprobs.size(), want.prompt_logprobs.size());
  for (size_t i = 0; i < got.prompt_logprobs.size(); ++i) {
    EXPECT_EQ(got.prompt_logprobs[i].id, want.prompt_logprobs[i].id);
    EXPECT_EQ(got.prompt_logprobs[i].logprob, want.prompt_logprobs[i].logprob)
        << "prompt token " << i;
    EXPECT_EQ(got.prompt_logprobs[i].top_ids, want.prompt_logprobs[i].top_ids);
  }
}

TEST_P(InterleavedPrefillTest, StreamingSessionStepsBetweenChunks) {
  // Unbounded gathering: between two chunks the streaming session always
  // gets its step (with the default bound it usually does).
  ModelExecutor executor(
      model_.get(), {.max_wait = absl::Seconds(60), .fraction_of_pass = 1e9});
  SpecEngine engine(&executor);
  std::mt19937 rng(3);
  const std::vector<int32_t> stream_prompt = RandomTokens(&rng, 5);
  // Chunks while a session streams.
  constexpr int kChunk = ModelExecutor::kInterleavedPrefillRows;
  const std::vector<int32_t> history = RandomTokens(&rng, kChunk * 2 + 7);
  const std::vector<int32_t> suffix = RandomTokens(&rng, kChunk * 3 + 5);
  // 3 chunks at admission, 4 for the turn.
  constexpr int kChunks = 7;

  for (int k : {0, 2}) {
    SCOPED_TRACE("k=" + std::to_string(k));
    // The streaming session: a long plain burst on its own thread.
    std::atomic<int> streamed{0};
    std::atomic<bool> prompted_done{false};
    auto streaming = engine.Admit("stream", kCapacity, stream_prompt,
                                  std::nullopt, /*speculative=*/false);
    ASSERT_TRUE(streaming.ok()) << streaming.status();
    std::thread stream([&] {
      BurstParams p;
      p.max_new = kCapacity - 8 - static_cast<int>(stream_prompt.size());
      auto r = engine.RunBurst(streaming->get(), p,
                               [&](absl::Span<const int32_t> t) {
                                 streamed += static_cast<int>(t.size());
                                 return !prompted_done.load();
                               });
      EXPECT_TRUE(r.ok()) << r.status();
    });
    while (streamed.load() < 2) std::this_thread::yield();

    const int before = streamed.load();
    int during = -1;
    const Turn got = RunTurn(&engine, "prompted", history, suffix, k, 12,
                             [&] { during = streamed.load() - before; });
    prompted_done = true;
    stream.join();
    // The streaming session steps before each chunk; the last step's token
    // may reach it after the prompted session's first.
    EXPECT_GE(during, kChunks - 1) << "the prefill held the model throughout";

    ModelExecutor alone_executor(model_.get());
    SpecEngine alone(&alone_executor);
    ExpectSameTurn(got, RunTurn(&alone, "alone", history, suffix, k, 12));
  }
}

// Chunked == one prefill: the session admitted with its whole history in
// one turn continues with the same tokens as one built from a history and
// a suffix whose chunk boundaries fall elsewhere.
TEST_P(InterleavedPrefillTest, ChunkBoundariesDoNotChangeTheTokens) {
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  std::mt19937 rng(8);
  const std::vector<int32_t> all =
      RandomTokens(&rng, ModelExecutor::kInterleavedPrefillRows * 3 + 11);
  for (int k : {0, 3}) {
    SCOPED_TRACE("k=" + std::to_string(k));
    const Turn whole = RunTurn(&engine, "whole", {}, all, k, 16);
    for (int split : {1, 37, ModelExecutor::kInterleavedPrefillRows,
                      ModelExecutor::kInterleavedPrefillRows * 2 + 5}) {
      SCOPED_TRACE("split=" + std::to_string(split));
      const std::vector<int32_t> head(all.begin(), all.begin() + split);
      const std::vector<int32_t> tail(all.begin() + split, all.end());
      const Turn parts = RunTurn(&engine, "parts", head, tail, k, 16);
      EXPECT_EQ(parts.tokens, whole.tokens);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, InterleavedPrefillTest,
    ::testing::ValuesIn(model::testing::DefaultAndTestModels()),
    model::testing::PathParamName);

}  // namespace
}  // namespace specserve::spec
