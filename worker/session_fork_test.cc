// ForkSession at every reusable position of a source, the prefix
// checkpoints inside its prompt included: a session forked there and given
// the rest of another prompt emits the tokens, and ends with the logits, of a
// session that prefilled that whole prompt from scratch, bit for bit (on
// the CPU at every position; with CUDA's prefill forms at the prefix
// checkpoints, which lie on the delta rule's chunk boundaries); the source
// saved its prefix checkpoints where PrefixCheckpointOptions says, and a
// position that is none of them is refused.
#include "worker/session_fork.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/model.h"
#include "worker/model/test_backend.h"
#include "worker/model/test_data.h"
#include "worker/spec/model_executor.h"
#include "worker/spec/spec_engine.h"

namespace specserve::worker {
namespace {

constexpr int kCapacity = 512;
constexpr int kEvery = 64;

class SessionForkTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    backend_ = model::testing::MakeTestBackend(&why);
    if (backend_ == nullptr) GTEST_SKIP() << why;
    auto loaded = model::Model::Load(model::testing::ModelDirOf(GetParam()),
                                     backend_.get());
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    model_ = std::move(*loaded);
    executor_ = std::make_unique<spec::ModelExecutor>(model_.get());
    engine_ = std::make_unique<spec::SpecEngine>(
        executor_.get(), spec::PrefixCheckpointOptions{kEvery, 2});
  }

  std::vector<int32_t> RandomTokens(int n) {
    std::uniform_int_distribution<int> d(0, model_->config().vocab_size - 1);
    std::vector<int32_t> t(n);
    for (auto& x : t) x = d(rng_);
    return t;
  }

  struct Turn {
    std::vector<int32_t> tokens;
    std::vector<float> last_logits;
  };
  // One greedy turn of `suffix` on `s` (speculative rounds when k > 0).
  Turn Run(spec::SpecSession* s, const std::vector<int32_t>& suffix, int k) {
    spec::BurstParams p;
    p.suffix = suffix;
    p.k = k;
    p.max_new = 6;
    Turn turn;
    auto r = engine_->RunBurst(s, p, [&](absl::Span<const int32_t> t) {
      turn.tokens.insert(turn.tokens.end(), t.begin(), t.end());
      return true;
    });
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(engine_->Flush(s).ok());
    turn.last_logits = s->last_logits();
    return turn;
  }

  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<spec::ModelExecutor> executor_;
  std::unique_ptr<spec::SpecEngine> engine_;
  std::mt19937 rng_{5150};
};

TEST_P(SessionForkTest, AForkAtAnyReusablePositionContinuesLikeAFreshPrefill) {
  for (int k : {0, 3}) {
    const bool spec = k > 0;
    // A prompt of 4 chunks and some: prefix checkpoints at 192 and 256.
    const std::vector<int32_t> prompt = RandomTokens(4 * kEvery + 29);
    auto src = engine_->Admit("src", kCapacity, {}, std::nullopt, spec);
    ASSERT_TRUE(src.ok()) << src.status();
    Run(src->get(), prompt, k);
    std::vector<int> at;
    for (const auto& c : (*src)->prefix_checkpoints()) at.push_back(c->pos);
    EXPECT_EQ(at, (std::vector<int>{3 * kEvery, 4 * kEvery}));
    const std::vector<int32_t> history = (*src)->committed;
    ASSERT_TRUE((*src)->rewind_pos().has_value());
    std::vector<int> positions = at;
    positions.push_back(*(*src)->rewind_pos());
    positions.push_back(static_cast<int>(history.size()));
    for (int pos : positions) {
      // Where the source's rows past the last chunk boundary were decoded,
      // or its prompt ended inside a chunk, the bf16 prefill forms agree
      // with a fresh prefill within the prefill tolerance only (DESIGN.md
      // §6); the prefix checkpoints sit on chunk boundaries of a prefill.
      if (!backend_->ExactPrefill() && pos % kEvery != 0) continue;
      SCOPED_TRACE("k " + std::to_string(k) + ", fork at " +
                   std::to_string(pos));
      const std::vector<uint32_t> prefix(history.begin(),
                                         history.begin() + pos);
      auto fork =
          ForkSession(executor_.get(), **src, "fork", kCapacity, prefix, spec);
      ASSERT_TRUE(fork.ok()) << fork.status();
      const std::vector<int32_t> rest = RandomTokens(1 + pos % 23);
      const Turn resumed = Run(fork->get(), rest, k);
      std::vector<int32_t> whole(history.begin(), history.begin() + pos);
      whole.insert(whole.end(), rest.begin(), rest.end());
      auto fresh = engine_->Admit("fresh", kCapacity, {}, std::nullopt, spec);
      ASSERT_TRUE(fresh.ok()) << fresh.status();
      const Turn scratch = Run(fresh->get(), whole, k);
      EXPECT_EQ(resumed.tokens, scratch.tokens);
      ASSERT_EQ(resumed.last_logits.size(), scratch.last_logits.size());
      EXPECT_EQ(
          std::memcmp(resumed.last_logits.data(), scratch.last_logits.data(),
                      resumed.last_logits.size() * sizeof(float)),
          0)
          << "the last logits differ";
    }
    // Between two checkpoints is no reusable position.
    const std::vector<uint32_t> between(history.begin(),
                                        history.begin() + 3 * kEvery + 5);
    auto refused =
        ForkSession(executor_.get(), **src, "x", kCapacity, between, spec);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition)
        << refused.status();
  }
}

TEST_P(SessionForkTest, CheckpointsInsideLaterTurnsJoinTheEarlierOnes) {
  auto s = engine_->Admit("s", kCapacity, {}, std::nullopt, false);
  ASSERT_TRUE(s.ok()) << s.status();
  Run(s->get(), RandomTokens(kEvery + 10), 0);  // saves 64
  const int len = (*s)->committed_len();
  Run(s->get(), RandomTokens(2 * kEvery), 0);  // saves 128 and 192, keeps 2
  std::vector<int> at;
  for (const auto& c : (*s)->prefix_checkpoints()) at.push_back(c->pos);
  std::vector<int> want;
  for (int q = kEvery; q < len + 2 * kEvery; q += kEvery) {
    if (q != len) want.push_back(q);
  }
  want.erase(want.begin(), want.end() - 2);
  EXPECT_EQ(at, want);
  // A rewind to the last prompt's start keeps those below it.
  ASSERT_TRUE(engine_->Rewind(s->get()).ok());
  for (int pos : (*s)->prefix_checkpoint_positions()) {
    EXPECT_LE(pos, (*s)->committed_len());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, SessionForkTest,
    ::testing::ValuesIn(model::testing::DefaultAndTestModels()),
    model::testing::PathParamName);

}  // namespace
}  // namespace specserve::worker
