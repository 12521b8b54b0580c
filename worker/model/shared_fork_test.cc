// Model::Fork with shared pages (copy-on-write): on SharingCheckBackend, a
// fork borrows its source's whole pages of attention rows; whatever either
// state does next (decode, verify, rewind below the fork, reset, offload and
// restore, outliving the other) it continues bit for bit like a state
// prefilled from scratch over its history, no shared byte is ever written
// (CheckShares), and StateBytes counts the shared pages once.
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/model.h"
#include "worker/model/model_test_fixture.h"
#include "worker/model/sharing_check_backend.h"
#include "worker/model/test_data.h"

namespace specserve::model {
namespace {

using testing::SameBytes;

class SharedForkTest : public testing::ModelTest {
 protected:
  SharedForkTest()
      : ModelTest({.seed = 77, .capacity = 160, .verify_columns = 5}) {}

  void SetUp() override {
    ModelTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    // A page of a few rows that does not divide a row: the partial row at
    // a page's end is half shared, half copied.
    sharing_ = std::make_unique<testing::SharingCheckBackend>(
        backend_.get(), 3 * model_->kv_row_bytes() + 40);
    auto m = Model::Load(dir_, sharing_.get());
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }
  void TearDown() override {
    model_.reset();
    sharing_.reset();
  }

  // A state holding `history` (prefilled, with the MTP rows an engine would
  // leave), its last hidden returned through `hidden`.
  std::unique_ptr<ModelState> Filled(const std::vector<int32_t>& history,
                                     std::vector<float>* hidden = nullptr,
                                     std::vector<int> share_rows = {}) {
    auto made = model_->NewState({.capacity = 160,
                                  .max_verify_columns = 5,
                                  .shareable = true,
                                  .share_rows = std::move(share_rows)});
    EXPECT_TRUE(made.ok()) << made.status();
    auto s = std::move(*made);
    ForwardResult r;
    EXPECT_TRUE(model_->Prefill(s.get(), history, {.all_rows = true}, &r).ok());
    const int n = static_cast<int>(history.size()) - 1;
    if (model_->has_mtp() && n > 0) {
      EXPECT_TRUE(model_
                      ->MtpForward(s.get(),
                                   absl::MakeConstSpan(r.hidden.data(), n * H_),
                                   absl::MakeConstSpan(history.data() + 1, n),
                                   0, nullptr)
                      .ok());
    }
    if (hidden != nullptr) hidden->assign(r.hidden.end() - H_, r.hidden.end());
    return s;
  }

  std::unique_ptr<ModelState> Fork(const ModelState& src,
                                   const TrunkCheckpoint* at = nullptr) {
    auto f = model_->Fork({.capacity = 160, .max_verify_columns = 5}, src, at);
    EXPECT_TRUE(f.ok()) << f.status();
    return f.ok() ? std::move(*f) : nullptr;
  }

  // `a` and `b` (same history) take the same steps, a verify with a
  // partial commit and then decodes, with equal outputs; both histories
  // grow by the tokens, appended to *history.
  void ExpectSameSteps(ModelState* a, ModelState* b,
                       std::vector<int32_t>* history) {
    ASSERT_EQ(a->length(), b->length());
    ForwardResult ra, rb;
    const std::vector<int32_t> cols = RandomTokens(3);
    ASSERT_TRUE(model_->Verify(a, cols, &ra).ok());
    ASSERT_TRUE(model_->Verify(b, cols, &rb).ok());
    EXPECT_TRUE(SameBytes(ra.logits, rb.logits)) << "verify logits";
    ASSERT_TRUE(model_->CommitVerified(a, 1).ok());
    ASSERT_TRUE(model_->CommitVerified(b, 1).ok());
    history->insert(history->end(), cols.begin(), cols.begin() + 2);
    for (int32_t t : RandomTokens(4)) {
      ASSERT_TRUE(model_->Decode(a, t, &ra).ok());
      ASSERT_TRUE(model_->Decode(b, t, &rb).ok());
      EXPECT_TRUE(SameBytes(ra.logits, rb.logits)) << "decode logits";
      history->push_back(t);
    }
    EXPECT_TRUE(SameBytes(LinearStates(*a), LinearStates(*b)));
    EXPECT_TRUE(sharing_->CheckShares().ok()) << sharing_->CheckShares();
  }

  // `s` continues like a state prefilled from scratch over *history,
  // which grows by the steps taken.
  void ExpectLikeFresh(ModelState* s, std::vector<int32_t>* history) {
    auto fresh = Filled(*history);
    ExpectSameSteps(fresh.get(), s, history);
  }

  std::unique_ptr<testing::SharingCheckBackend> sharing_;
};

TEST_P(SharedForkTest, AForkBorrowsWholePagesAndCountsThemOnce) {
  std::vector<int32_t> history = RandomTokens(40);
  auto src = Filled(history);
  const uint64_t alone = model_->StateBytes(*src);
  auto fork = Fork(*src);
  ASSERT_NE(fork, nullptr);
  EXPECT_GT(sharing_->shares(), 0);
  const uint64_t shared = sharing_->SharedBytes();
  ASSERT_GT(shared, 0u);
  // The fork's own bytes: everything but the pages its source holds too.
  EXPECT_EQ(model_->StateBytes(*fork), alone - shared);
  EXPECT_EQ(model_->StateBytes(*src), alone);
  ExpectSameSteps(src.get(), fork.get(), &history);
  ExpectLikeFresh(fork.get(), &history);
  // Once the source is gone its pages are the fork's alone.
  src.reset();
  EXPECT_EQ(model_->StateBytes(*fork), alone);
  ExpectLikeFresh(fork.get(), &history);
}

// A source laid out for forks at rows 13 and 27 (StateOptions::share_rows):
// a fork at 27 shares all whole pages below it; one at a checkpoint at 20,
// inside the piece between the two, shares only the piece below 13 and
// copies the rest; both continue like fresh states.
TEST_P(SharedForkTest, ForksShareWholePiecesBetweenShareRows) {
  const std::vector<int32_t> all = RandomTokens(27);
  const std::vector<int32_t> first(all.begin(), all.begin() + 20);
  auto src = Filled(first, nullptr, {13, 27});
  auto cp = model_->SaveCheckpoint(*src);
  ASSERT_TRUE(cp.ok());
  ForwardResult r;
  ASSERT_TRUE(
      model_->Prefill(src.get(), absl::MakeConstSpan(all).subspan(20), {}, &r)
          .ok());
  const uint64_t buffers = 2 * model_->config().num_full_attention_layers();
  const uint64_t page = sharing_->SharingPageBytes();
  auto whole_pages = [&](int rows) {
    return rows * model_->kv_row_bytes() / page * page;
  };
  ASSERT_GT(whole_pages(13), 0u);
  ASSERT_LT(whole_pages(13), whole_pages(20));

  auto at_end = Fork(*src);
  ASSERT_NE(at_end, nullptr);
  EXPECT_EQ(sharing_->SharedBytes(), buffers * whole_pages(27));
  auto at_20 = Fork(*src, cp->get());
  ASSERT_NE(at_20, nullptr);
  EXPECT_EQ(sharing_->SharedBytes(),
            buffers * (whole_pages(27) + whole_pages(13)));

  std::vector<int32_t> history = all;
  ExpectLikeFresh(at_end.get(), &history);
  history = first;
  ExpectLikeFresh(at_20.get(), &history);
}

TEST_P(SharedForkTest, TheSourceRewindsBelowTheForkAndWritesAnotherHistory) {
  std::vector<int32_t> prompt = RandomTokens(12);
  auto src = Filled(prompt);
  auto cp = model_->SaveCheckpoint(*src);
  ASSERT_TRUE(cp.ok());
  // A reply, then a fork at the committed end: it borrows rows past the
  // checkpoint.
  std::vector<int32_t> history = prompt;
  ForwardResult r;
  for (int32_t t : RandomTokens(30)) {
    ASSERT_TRUE(model_->Decode(src.get(), t, &r).ok());
    history.push_back(t);
  }
  auto fork = Fork(*src);
  ASSERT_NE(fork, nullptr);
  // "Regenerate": the source returns to its prompt and writes other rows
  // where the fork's borrowed pages were.
  ASSERT_TRUE(model_->RestoreCheckpoint(src.get(), **cp).ok());
  EXPECT_GT(sharing_->unshares(), 0);
  std::vector<int32_t> other = prompt;
  for (int32_t t : RandomTokens(30)) {
    ASSERT_TRUE(model_->Decode(src.get(), t, &r).ok());
    other.push_back(t);
  }
  EXPECT_TRUE(sharing_->CheckShares().ok()) << sharing_->CheckShares();
  ExpectLikeFresh(fork.get(), &history);
  ExpectLikeFresh(src.get(), &other);
}

TEST_P(SharedForkTest,
       AForkAtACheckpointRewindsResetsAndRestoresOnItsOwnPages) {
  std::vector<int32_t> prompt = RandomTokens(33);
  auto src = Filled(prompt);
  auto cp = model_->SaveCheckpoint(*src);
  ASSERT_TRUE(cp.ok());
  ForwardResult r;
  std::vector<int32_t> src_history = prompt;
  for (int32_t t : RandomTokens(6)) {
    ASSERT_TRUE(model_->Decode(src.get(), t, &r).ok());
    src_history.push_back(t);
  }
  auto fork = Fork(*src, cp->get());
  ASSERT_NE(fork, nullptr);
  EXPECT_EQ(fork->length(), 33);
  // A fork of the fork: three states on the same pages.
  auto grandchild = Fork(*fork);
  ASSERT_NE(grandchild, nullptr);
  // The fork is reset and takes another prompt.
  ASSERT_TRUE(model_->Reset(fork.get()).ok());
  std::vector<int32_t> fork_history = RandomTokens(25);
  ASSERT_TRUE(model_->Prefill(fork.get(), fork_history, {}, &r).ok());
  EXPECT_TRUE(sharing_->CheckShares().ok()) << sharing_->CheckShares();
  std::vector<int32_t> grandchild_history = prompt;
  ExpectLikeFresh(grandchild.get(), &grandchild_history);
  // The grandchild goes to host memory and back, then is restored in place.
  auto snap = model_->Offload(grandchild.get());
  ASSERT_TRUE(snap.ok());
  ASSERT_TRUE(model_->Restore(grandchild.get(), **snap).ok());
  ASSERT_TRUE(model_->Restore(grandchild.get(), **snap).ok());
  EXPECT_TRUE(sharing_->CheckShares().ok()) << sharing_->CheckShares();
  ExpectLikeFresh(grandchild.get(), &grandchild_history);
  ExpectLikeFresh(fork.get(), &fork_history);
  ExpectLikeFresh(src.get(), &src_history);
}

INSTANTIATE_TEST_SUITE_P(TestModels, SharedForkTest,
                         ::testing::ValuesIn(testing::TestModelDirs()),
                         testing::PathParamName);

}  // namespace
}  // namespace specserve::model
