// The executor's gathering (ModelExecutor::LoopMember): sessions that stream
// together step in one pass each time, bit-identical to each stepping alone,
// and a member that is away (not blocked on the executor) delays the others
// by at most the gather bound.
#include "worker/spec/model_executor.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/model.h"
#include "worker/model/test_backend.h"
#include "worker/model/test_data.h"

namespace specserve::spec {
namespace {

class ModelExecutorTest : public ::testing::TestWithParam<std::string> {
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

  // A state holding a random prompt of `n` tokens; its next token is the
  // prompt's prediction.
  std::unique_ptr<model::ModelState> Prompted(std::mt19937* rng, int n,
                                              int32_t* next) {
    std::uniform_int_distribution<int> d(0, model_->config().vocab_size - 1);
    std::vector<int32_t> prompt(n);
    for (auto& t : prompt) t = d(*rng);
    auto state = model_->NewState({.capacity = 64}).value();
    model::ForwardResult r;
    EXPECT_TRUE(model_->Prefill(state.get(), prompt, {}, &r).ok());
    *next = r.argmax.back();
    return state;
  }

  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::Model> model_;
};

// With an unbounded gather, members that stream together always step
// together: every pass carries all of them, and each one's tokens equal its
// greedy decode alone.
TEST_P(ModelExecutorTest, StreamingMembersStepTogether) {
  constexpr int kSessions = 4;
  constexpr int kSteps = 12;
  ModelExecutor executor(
      model_.get(), {.max_wait = absl::Seconds(60), .fraction_of_pass = 1e9});
  std::mt19937 rng(5);
  std::vector<std::unique_ptr<model::ModelState>> batched, alone;
  std::vector<int32_t> first(kSessions);
  for (int i = 0; i < kSessions; ++i) {
    std::mt19937 same = rng;
    batched.push_back(Prompted(&rng, 3 + 2 * i, &first[i]));
    int32_t unused;
    alone.push_back(Prompted(&same, 3 + 2 * i, &unused));
  }
  std::vector<std::vector<int32_t>> got(kSessions);
  std::atomic<int> registered{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&, i] {
      ModelExecutor::LoopMember member(&executor);
      ++registered;
      while (registered.load() < kSessions) std::this_thread::yield();
      int32_t token = first[i];
      for (int step = 0; step < kSteps; ++step) {
        model::ForwardResult out;
        out.want_logits = false;
        ASSERT_TRUE(executor.Decode(batched[i].get(), token, &out).ok());
        token = out.argmax[0];
        got[i].push_back(token);
      }
    });
  }
  for (auto& t : threads) t.join();

  const ModelExecutor::Stats stats = executor.stats();
  EXPECT_EQ(stats.steps, static_cast<uint64_t>(kSessions * kSteps));
  EXPECT_EQ(stats.batches, static_cast<uint64_t>(kSteps))
      << "a pass started without every streaming session";
  EXPECT_EQ(stats.gather_timeouts, 0u);
  for (int i = 0; i < kSessions; ++i) {
    int32_t token = first[i];
    for (int step = 0; step < kSteps; ++step) {
      model::ForwardResult out;
      out.want_logits = false;
      ASSERT_TRUE(model_->Decode(alone[i].get(), token, &out).ok());
      token = out.argmax[0];
      ASSERT_EQ(got[i][step], token) << "session " << i << " step " << step;
    }
  }
}

// A member that is away (here: sleeping, as a session whose client is slow
// to take its tokens) holds each pass for at most the gather bound: the
// other member's steps all run while it is still away.
TEST_P(ModelExecutorTest, AMemberAwayDoesNotHoldThePasses) {
  constexpr int kSteps = 5;
  ModelExecutor executor(model_.get());
  std::mt19937 rng(9);
  int32_t token;
  auto state = Prompted(&rng, 6, &token);
  std::atomic<bool> away{true};
  std::atomic<bool> away_registered{false};
  std::thread idle([&] {
    ModelExecutor::LoopMember member(&executor);
    away_registered = true;
    std::this_thread::sleep_for(std::chrono::seconds(3));
    away = false;
  });
  while (!away_registered.load()) std::this_thread::yield();
  {
    ModelExecutor::LoopMember member(&executor);
    for (int step = 0; step < kSteps; ++step) {
      model::ForwardResult out;
      out.want_logits = false;
      ASSERT_TRUE(executor.Decode(state.get(), token, &out).ok());
      token = out.argmax[0];
    }
  }
  EXPECT_TRUE(away.load()) << "the passes waited for the member away";
  idle.join();
  const ModelExecutor::Stats stats = executor.stats();
  EXPECT_EQ(stats.batches, static_cast<uint64_t>(kSteps));
  EXPECT_EQ(stats.gather_timeouts, static_cast<uint64_t>(kSteps));
}

// A nested member on one thread counts once: its own steps never wait.
TEST_P(ModelExecutorTest, ANestedMemberCountsOnce) {
  ModelExecutor executor(
      model_.get(), {.max_wait = absl::Seconds(60), .fraction_of_pass = 1e9});
  std::mt19937 rng(13);
  int32_t token;
  auto state = Prompted(&rng, 4, &token);
  ModelExecutor::LoopMember member(&executor);
  ModelExecutor::LoopMember nested(&executor);
  for (int step = 0; step < 3; ++step) {
    model::ForwardResult out;
    out.want_logits = false;
    ASSERT_TRUE(executor.Decode(state.get(), token, &out).ok());
    token = out.argmax[0];
  }
  EXPECT_EQ(executor.stats().gather_timeouts, 0u);
}

// Prompt chunks queued while the model is busy run as one PrefillBatch
// pass, each session's outputs bit-identical to its prefill alone.
TEST_P(ModelExecutorTest, QueuedPrefillChunksShareAPass) {
  constexpr int kSessions = 4;
  ModelExecutor executor(model_.get());
  std::mt19937 rng(21);
  std::uniform_int_distribution<int> d(0, model_->config().vocab_size - 1);
  std::vector<std::unique_ptr<model::ModelState>> batched, alone;
  std::vector<std::vector<int32_t>> chunks;
  for (int i = 0; i < kSessions; ++i) {
    int32_t unused;
    std::mt19937 same = rng;
    batched.push_back(Prompted(&rng, 2 + i, &unused));
    alone.push_back(Prompted(&same, 2 + i, &unused));
    chunks.emplace_back(1 + 5 * i);
    for (auto& t : chunks.back()) t = d(rng);
  }
  std::vector<model::ForwardResult> got(kSessions);
  std::vector<std::vector<float>> hidden(kSessions);
  std::vector<absl::Status> status(kSessions);
  std::vector<std::thread> threads;
  ASSERT_TRUE(executor
                  .Exclusive([&] {
                    for (int i = 0; i < kSessions; ++i) {
                      threads.emplace_back([&, i] {
                        status[i] = executor.Prefill(
                            batched[i].get(), chunks[i], &hidden[i], &got[i]);
                      });
                    }
                    std::this_thread::sleep_for(std::chrono::milliseconds(300));
                    return absl::OkStatus();
                  })
                  .ok());
  for (auto& t : threads) t.join();
  for (int i = 0; i < kSessions; ++i) {
    ASSERT_TRUE(status[i].ok()) << status[i];
    model::ForwardResult want;
    std::vector<float> want_hidden;
    ASSERT_TRUE(model_
                    ->Prefill(alone[i].get(), chunks[i],
                              {.all_hidden = &want_hidden}, &want)
                    .ok());
    EXPECT_EQ(got[i].argmax, want.argmax) << "session " << i;
    EXPECT_EQ(got[i].logits, want.logits) << "session " << i;
    EXPECT_EQ(got[i].hidden, want.hidden) << "session " << i;
    EXPECT_EQ(hidden[i], want_hidden) << "session " << i;
  }
  const ModelExecutor::Stats stats = executor.stats();
  EXPECT_EQ(stats.prefill_chunks, static_cast<uint64_t>(kSessions));
  EXPECT_LT(stats.prefill_passes, stats.prefill_chunks)
      << "no prompt chunk was batched";
}

INSTANTIATE_TEST_SUITE_P(
    Models, ModelExecutorTest,
    ::testing::ValuesIn(model::testing::DefaultAndTestModels()),
    model::testing::PathParamName);

}  // namespace
}  // namespace specserve::spec
