// PrefillBatch (several sessions' prompt chunks in one trunk pass) against
// Prefill of each session alone, on every tiny model in tests/models and the
// default model, on the backend the target links (prefill_batch_test on the
// CPU, prefill_batch_cuda_test on CUDA device 0): the last row's logits,
// hidden and argmax, every row's hidden, the linear states byte for byte and
// the decode that follows; bad batches are refused before anything runs.
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/model.h"
#include "worker/model/model_test_fixture.h"
#include "worker/model/test_data.h"

namespace specserve::model {
namespace {

using testing::SameBytes;

class PrefillBatchTest : public testing::ModelTest {
 protected:
  PrefillBatchTest()
      : ModelTest({.seed = 20261203, .capacity = 160, .verify_columns = 1}) {}
};

TEST_P(PrefillBatchTest, EqualsPrefillOfEachSessionAlone) {
  for (int n = 1; n <= 6; ++n) {
    SCOPED_TRACE("sessions " + std::to_string(n));
    std::vector<std::unique_ptr<ModelState>> batched, alone;
    std::vector<ModelState*> all;
    std::vector<std::vector<int32_t>> chunks;
    int rows = 0;
    for (int i = 0; i < n; ++i) {
      // Mixed histories (an empty one now and then) and chunk lengths
      // (single rows too, as a decode step is), at most kMaxRows in all.
      const int len = (i == 1 ? 0 : static_cast<int>(rng_() % 50));
      const std::vector<int32_t> history = RandomTokens(len);
      batched.push_back(NewState());
      alone.push_back(NewState());
      Prefill(batched.back().get(), history);
      Prefill(alone.back().get(), history);
      all.push_back(batched.back().get());
      const int room = Model::kMaxRows - rows - (n - 1 - i);
      const int want = (i % 3 == 2) ? 1 : 1 + static_cast<int>(rng_() % 30);
      chunks.push_back(RandomTokens(std::min(want, room)));
      rows += static_cast<int>(chunks.back().size());
    }
    std::vector<ForwardResult> got(n);
    std::vector<ForwardResult*> outs;
    std::vector<std::vector<float>> hidden(n);
    std::vector<std::vector<float>*> hiddens;
    std::vector<absl::Span<const int32_t>> tokens;
    for (int i = 0; i < n; ++i) {
      outs.push_back(&got[i]);
      // Every other session asks for its rows' hidden.
      hiddens.push_back(i % 2 == 0 ? &hidden[i] : nullptr);
      tokens.push_back(chunks[i]);
    }
    ASSERT_TRUE(model_->PrefillBatch(all, tokens, hiddens, outs).ok());
    for (int i = 0; i < n; ++i) {
      SCOPED_TRACE("session " + std::to_string(i));
      ForwardResult want;
      std::vector<float> want_hidden;
      ASSERT_TRUE(model_
                      ->Prefill(alone[i].get(), chunks[i],
                                {.all_hidden = &want_hidden}, &want)
                      .ok());
      EXPECT_EQ(got[i].rows, want.rows);
      EXPECT_EQ(got[i].first_position, want.first_position);
      EXPECT_EQ(got[i].argmax, want.argmax);
      EXPECT_EQ(got[i].finite, want.finite);
      EXPECT_TRUE(SameBytes(got[i].logits, want.logits)) << "logits";
      EXPECT_TRUE(SameBytes(got[i].hidden, want.hidden)) << "hidden";
      if (i % 2 == 0) {
        EXPECT_TRUE(SameBytes(hidden[i], want_hidden)) << "rows' hidden";
      }
      EXPECT_EQ(batched[i]->length(), alone[i]->length());
      EXPECT_TRUE(
          SameBytes(LinearStates(*batched[i]), LinearStates(*alone[i])));
      for (int32_t t : RandomTokens(3)) {
        ForwardResult a, b;
        ASSERT_TRUE(model_->Decode(batched[i].get(), t, &a).ok());
        ASSERT_TRUE(model_->Decode(alone[i].get(), t, &b).ok());
        EXPECT_TRUE(SameBytes(a.logits, b.logits)) << "continuation";
      }
    }
  }
}

TEST_P(PrefillBatchTest, BadBatchesAreRefusedBeforeAnythingRuns) {
  auto a = NewState(), b = NewState();
  Prefill(a.get(), RandomTokens(4));
  Prefill(b.get(), RandomTokens(6));
  const std::vector<float> before = LinearStates(*a);
  const std::vector<int32_t> three = RandomTokens(3);
  const std::vector<int32_t> none;
  // More rows in all than one prefill pass holds, each session within its
  // capacity.
  auto roomy = NewState(Model::kMaxPrefillRows + 8);
  const std::vector<int32_t> too_many = RandomTokens(Model::kMaxPrefillRows);
  const std::vector<int32_t> bad_id = {0, model_->config().vocab_size};
  ForwardResult r0, r1;
  std::vector<ForwardResult*> two = {&r0, &r1};
  auto refused = [&](std::vector<ModelState*> states,
                     std::vector<absl::Span<const int32_t>> tokens) {
    return model_->PrefillBatch(states, tokens, {}, two).code();
  };
  EXPECT_EQ(refused({a.get(), a.get()}, {three, three}),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused({a.get(), b.get()}, {three, none}),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused({a.get(), roomy.get()}, {three, too_many}),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(roomy->length(), 0);
  EXPECT_EQ(refused({a.get(), b.get()}, {three, bad_id}),
            absl::StatusCode::kInvalidArgument);
  auto full = NewState();
  Prefill(full.get(), RandomTokens(options_.capacity - 2));
  EXPECT_EQ(refused({a.get(), full.get()}, {three, three}),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(a->length(), 4);
  EXPECT_EQ(b->length(), 6);
  EXPECT_TRUE(SameBytes(LinearStates(*a), before));
}

INSTANTIATE_TEST_SUITE_P(Models, PrefillBatchTest,
                         ::testing::ValuesIn(testing::DefaultAndTestModels()),
                         testing::PathParamName);

}  // namespace
}  // namespace specserve::model
