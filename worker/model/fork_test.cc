// Model::ForkState: a fork continues bit-identically to its source and to a
// state built from scratch over the same tokens (prefill == decode), at the
// committed end and at a checkpoint, MTP rows included; bad forks are
// refused with the right status.
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "worker/model/model.h"
#include "worker/model/model_test_fixture.h"
#include "worker/model/test_data.h"

namespace specserve::model {
namespace {

using testing::SameBytes;

class ForkTest : public testing::ModelTest {
 protected:
  ForkTest() : ModelTest({.seed = 32, .capacity = 128, .verify_columns = 5}) {}

  // Prefills `prompt` and runs the MTP head over it (rows 0..n-2), as the
  // engine leaves a session; returns the last row's hidden.
  std::vector<float> Fill(ModelState* s, const std::vector<int32_t>& prompt) {
    ForwardResult r;
    EXPECT_TRUE(model_->Prefill(s, prompt, {.all_rows = true}, &r).ok());
    const int n = static_cast<int>(prompt.size()) - 1;
    if (model_->has_mtp() && n > 0) {
      EXPECT_TRUE(model_
                      ->MtpForward(
                          s, absl::MakeConstSpan(r.hidden.data(), n * H_),
                          absl::MakeConstSpan(prompt.data() + 1, n), 0, nullptr)
                      .ok());
    }
    return std::vector<float>(r.hidden.end() - H_, r.hidden.end());
  }

  // Both states take the same steps: an MTP draft step at the last row
  // (when the model has a head), a verify of 3 columns with a partial
  // commit, then decodes; every output must match bit for bit.
  void ExpectSameSteps(ModelState* a, ModelState* b,
                       const std::vector<float>& last_hidden) {
    ASSERT_EQ(a->length(), b->length());
    ForwardResult ra, rb;
    if (model_->has_mtp() && a->has_draft_state() && b->has_draft_state()) {
      ASSERT_EQ(a->mtp_length(), b->mtp_length());
      const int row = a->length() - 1;
      ASSERT_TRUE(model_->MtpDraft(a, last_hidden, 7, row, &ra).ok());
      ASSERT_TRUE(model_->MtpDraft(b, last_hidden, 7, row, &rb).ok());
      EXPECT_TRUE(SameBytes(ra.logits, rb.logits)) << "draft logits";
      EXPECT_TRUE(SameBytes(ra.hidden, rb.hidden)) << "draft hidden";
      ASSERT_TRUE(model_->TruncateMtp(a, row).ok());
      ASSERT_TRUE(model_->TruncateMtp(b, row).ok());
    }
    const std::vector<int32_t> cols = RandomTokens(3);
    ASSERT_TRUE(model_->Verify(a, cols, &ra).ok());
    ASSERT_TRUE(model_->Verify(b, cols, &rb).ok());
    EXPECT_TRUE(SameBytes(ra.logits, rb.logits)) << "verify logits";
    ASSERT_TRUE(model_->CommitVerified(a, 1).ok());
    ASSERT_TRUE(model_->CommitVerified(b, 1).ok());
    for (int32_t t : RandomTokens(4)) {
      ASSERT_TRUE(model_->Decode(a, t, &ra).ok());
      ASSERT_TRUE(model_->Decode(b, t, &rb).ok());
      EXPECT_TRUE(SameBytes(ra.logits, rb.logits)) << "decode logits";
      EXPECT_TRUE(SameBytes(ra.hidden, rb.hidden)) << "decode hidden";
    }
    EXPECT_TRUE(SameBytes(LinearStates(*a), LinearStates(*b)));
  }
};

TEST_P(ForkTest, ForkAtCommittedEndContinuesLikeTheSource) {
  const std::vector<int32_t> prompt = RandomTokens(13);
  auto src = NewState();
  const std::vector<float> h = Fill(src.get(), prompt);
  // The fork has a capacity of its own.
  auto dst = NewState(64);
  ASSERT_TRUE(model_->ForkState(*src, nullptr, dst.get()).ok());
  EXPECT_EQ(dst->length(), 13);
  EXPECT_EQ(dst->mtp_length(), src->mtp_length());
  ExpectSameSteps(src.get(), dst.get(), h);
}

TEST_P(ForkTest, ForkAtCheckpointEqualsAFreshPrefill) {
  const std::vector<int32_t> prompt = RandomTokens(11);
  auto src = NewState();
  const std::vector<float> h = Fill(src.get(), prompt);
  auto cp = model_->SaveCheckpoint(*src);
  ASSERT_TRUE(cp.ok()) << cp.status();
  // The source moves on past the checkpoint (a reply, a verify).
  ForwardResult r;
  for (int32_t t : RandomTokens(5))
    ASSERT_TRUE(model_->Decode(src.get(), t, &r).ok());
  ASSERT_TRUE(model_->Verify(src.get(), RandomTokens(4), &r).ok());
  ASSERT_TRUE(model_->CommitVerified(src.get(), 2).ok());
  auto fork = NewState();
  ASSERT_TRUE(model_->ForkState(*src, cp->get(), fork.get()).ok());
  EXPECT_EQ(fork->length(), 11);
  auto fresh = NewState();
  Fill(fresh.get(), prompt);
  EXPECT_EQ(fork->mtp_length(), fresh->mtp_length());
  ExpectSameSteps(fresh.get(), fork.get(), h);
}

TEST_P(ForkTest, ForkWithoutDraftStateCopiesTheTrunkOnly) {
  const std::vector<int32_t> prompt = RandomTokens(9);
  auto src = NewState();
  const std::vector<float> h = Fill(src.get(), prompt);
  auto plain = model_->NewState({.capacity = 32, .draft_state = false});
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE(model_->ForkState(*src, nullptr, plain->get()).ok());
  EXPECT_EQ((*plain)->mtp_length(), 0);
  ForwardResult ra, rb;
  for (int32_t t : RandomTokens(4)) {
    ASSERT_TRUE(model_->Decode(src.get(), t, &ra).ok());
    ASSERT_TRUE(model_->Decode(plain->get(), t, &rb).ok());
    EXPECT_TRUE(SameBytes(ra.logits, rb.logits));
  }
}

TEST_P(ForkTest, RefusesForksThatCannotBeExact) {
  auto src = NewState();
  Fill(src.get(), RandomTokens(10));
  auto small = NewState(8);
  EXPECT_EQ(model_->ForkState(*src, nullptr, small.get()).code(),
            absl::StatusCode::kOutOfRange);
  auto used = NewState();
  Fill(used.get(), RandomTokens(2));
  EXPECT_EQ(model_->ForkState(*src, nullptr, used.get()).code(),
            absl::StatusCode::kFailedPrecondition);
  ForwardResult r;
  ASSERT_TRUE(model_->Verify(src.get(), RandomTokens(2), &r).ok());
  auto dst = NewState();
  EXPECT_EQ(model_->ForkState(*src, nullptr, dst.get()).code(),
            absl::StatusCode::kFailedPrecondition);
  model_->DiscardVerified(src.get());
  auto snap = model_->Offload(src.get());
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ(model_->ForkState(*src, nullptr, dst.get()).code(),
            absl::StatusCode::kFailedPrecondition);
}

INSTANTIATE_TEST_SUITE_P(TestModels, ForkTest,
                         ::testing::ValuesIn(testing::TestModelDirs()),
                         testing::PathParamName);

}  // namespace
}  // namespace specserve::model
