// The batched passes of speculative rounds against the same pass of each
// session alone, on every tiny model in tests/models and the default model,
// on the backend the target links (verify_batch_test on the CPU,
// verify_batch_cuda_test on CUDA device 0):
//  - VerifyBatch (several sessions' verify columns in one trunk pass):
//    logits, hidden, argmax and every column's captured linear states byte
//    for byte; after committing a column per session the sessions continue
//    identically; bad batches are refused before anything runs;
//  - MtpDraftBatch (one draft step of several sessions in one MTP pass):
//    chained draft steps equal MtpDraft alone, byte for byte;
//  - MtpBatch with owed rows and a draft step per session: equal to
//    MtpForward of the owed rows, then MtpDraft, alone.
#include <algorithm>
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

class VerifyBatchTest : public testing::ModelTest {
 protected:
  VerifyBatchTest()
      : ModelTest({.seed = 20261202, .capacity = 96, .verify_columns = 9}) {}

  // Prefills `prompt` on `s` and returns every row's final-norm hidden.
  std::vector<float> PrefillHiddens(ModelState* s,
                                    const std::vector<int32_t>& prompt) {
    ForwardResult r;
    EXPECT_TRUE(model_->Prefill(s, prompt, {.all_rows = true}, &r).ok());
    return r.hidden;
  }
};

TEST_P(VerifyBatchTest, EqualsVerifyOfEachSessionAlone) {
  for (int n = 1; n <= 7; ++n) {
    SCOPED_TRACE("sessions " + std::to_string(n));
    std::vector<std::unique_ptr<ModelState>> batched, alone;
    std::vector<ModelState*> all;
    std::vector<std::vector<int32_t>> columns;
    for (int i = 0; i < n; ++i) {
      // Mixed lengths and column counts (k + 1 = 1..9, a different k per
      // session), including an empty session now and then.
      const int len = (i == 2 ? 0 : 1 + static_cast<int>(rng_() % 40));
      const std::vector<int32_t> prompt = RandomTokens(len);
      batched.push_back(NewState());
      alone.push_back(NewState());
      Prefill(batched.back().get(), prompt);
      Prefill(alone.back().get(), prompt);
      all.push_back(batched.back().get());
      columns.push_back(RandomTokens(1 + static_cast<int>(rng_() % 9)));
    }
    std::vector<ForwardResult> got(n);
    std::vector<ForwardResult*> outs;
    for (ForwardResult& r : got) outs.push_back(&r);
    ASSERT_TRUE(model_->VerifyBatch(all, columns, outs).ok());
    for (int i = 0; i < n; ++i) {
      SCOPED_TRACE("session " + std::to_string(i));
      ForwardResult want;
      ASSERT_TRUE(model_->Verify(alone[i].get(), columns[i], &want).ok());
      EXPECT_EQ(got[i].rows, want.rows);
      EXPECT_EQ(got[i].argmax, want.argmax);
      EXPECT_EQ(got[i].finite, want.finite);
      EXPECT_TRUE(SameBytes(got[i].logits, want.logits)) << "logits";
      EXPECT_TRUE(SameBytes(got[i].hidden, want.hidden)) << "hidden";
      for (int c = 0; c < static_cast<int>(columns[i].size()); ++c) {
        EXPECT_TRUE(
            SameBytes(LinearStates(*batched[i], c), LinearStates(*alone[i], c)))
            << "captured states of column " << c;
      }
    }
    // Each session commits (or discards) on its own and continues as the
    // one verified alone does.
    for (int i = 0; i < n; ++i) {
      const int keep = static_cast<int>(rng_() % (columns[i].size() + 1)) - 1;
      if (keep < 0) {
        model_->DiscardVerified(batched[i].get());
        model_->DiscardVerified(alone[i].get());
      } else {
        ASSERT_TRUE(model_->CommitVerified(batched[i].get(), keep).ok());
        ASSERT_TRUE(model_->CommitVerified(alone[i].get(), keep).ok());
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

TEST_P(VerifyBatchTest, CopyLogitsRowAddressesTheWholePass) {
  auto a = NewState(), b = NewState();
  Prefill(a.get(), RandomTokens(5));
  Prefill(b.get(), RandomTokens(7));
  const std::vector<std::vector<int32_t>> columns = {RandomTokens(2),
                                                     RandomTokens(3)};
  ForwardResult ra, rb;
  ra.want_logits = rb.want_logits = true;
  std::vector<ModelState*> states = {a.get(), b.get()};
  std::vector<ForwardResult*> outs = {&ra, &rb};
  ASSERT_TRUE(model_->VerifyBatch(states, columns, outs).ok());
  // Session b's column 1 is the pass's row 2 + 1.
  std::vector<float> row;
  ASSERT_TRUE(model_->CopyLogitsRow(3, &row).ok());
  EXPECT_TRUE(SameBytes(row, rb.logits.data() + V_, V_));
  EXPECT_FALSE(model_->CopyLogitsRow(5, &row).ok());
  model_->DiscardVerified(a.get());
  model_->DiscardVerified(b.get());
}

TEST_P(VerifyBatchTest, BadBatchesAreRefusedBeforeAnythingRuns) {
  auto a = NewState(), b = NewState();
  Prefill(a.get(), RandomTokens(4));
  Prefill(b.get(), RandomTokens(4));
  const std::vector<float> before = LinearStates(*a);
  ForwardResult ra, rb;
  std::vector<ForwardResult*> outs = {&ra, &rb};
  auto run = [&](std::vector<ModelState*> states,
                 std::vector<std::vector<int32_t>> columns) {
    return model_->VerifyBatch(states, columns, outs).code();
  };
  EXPECT_EQ(run({a.get(), a.get()}, {{1}, {2}}),
            absl::StatusCode::kInvalidArgument);  // twice
  EXPECT_EQ(run({a.get(), b.get()}, {{1}, {}}),
            absl::StatusCode::kInvalidArgument);  // no columns
  EXPECT_EQ(run({a.get(), b.get()}, {{1}, RandomTokens(10)}),
            absl::StatusCode::kInvalidArgument);  // past max_verify_columns
  EXPECT_EQ(run({a.get(), b.get()}, {{1}, {V_}}),
            absl::StatusCode::kInvalidArgument);  // id outside the vocabulary
  ForwardResult pending;
  ASSERT_TRUE(model_->Verify(b.get(), {3}, &pending).ok());
  EXPECT_EQ(run({a.get(), b.get()}, {{1}, {2}}),
            absl::StatusCode::kFailedPrecondition);
  model_->DiscardVerified(b.get());
  // Nothing ran on a: no pending verify, its states untouched.
  EXPECT_EQ(a->verified_columns(), 0);
  EXPECT_TRUE(SameBytes(LinearStates(*a), before));
  // More columns in all than one pass holds.
  std::vector<std::unique_ptr<ModelState>> many;
  std::vector<ModelState*> states;
  std::vector<std::vector<int32_t>> columns;
  std::vector<ForwardResult> results(Model::kMaxRows / 9 + 1);
  std::vector<ForwardResult*> many_outs;
  for (ForwardResult& r : results) {
    many.push_back(NewState());
    Prefill(many.back().get(), RandomTokens(2));
    states.push_back(many.back().get());
    columns.push_back(RandomTokens(9));
    many_outs.push_back(&r);
  }
  EXPECT_EQ(model_->VerifyBatch(states, columns, many_outs).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(VerifyBatchTest, MtpDraftBatchEqualsMtpDraftAlone) {
  if (!model_->has_mtp()) GTEST_SKIP() << "no MTP head";
  constexpr int kSessions = 6;
  std::vector<std::unique_ptr<ModelState>> batched, alone;
  std::vector<std::vector<float>> h_batched, h_alone;
  std::vector<int32_t> tok_batched, tok_alone;
  std::vector<int> pos;
  for (int i = 0; i < kSessions; ++i) {
    const std::vector<int32_t> prompt = RandomTokens(2 + 5 * i);
    for (auto* v : {&batched, &alone}) {
      v->push_back(NewState());
      const std::vector<float> hidden = PrefillHiddens(v->back().get(), prompt);
      const int n = static_cast<int>(prompt.size()) - 1;
      ASSERT_TRUE(model_
                      ->MtpForward(v->back().get(),
                                   absl::MakeConstSpan(hidden.data(), n * H_),
                                   absl::MakeConstSpan(prompt.data() + 1, n), 0,
                                   nullptr)
                      .ok());
      if (v == &batched) {
        h_batched.emplace_back(hidden.end() - H_, hidden.end());
        h_alone.emplace_back(hidden.end() - H_, hidden.end());
      }
    }
    const int32_t t = RandomTokens(1)[0];
    tok_batched.push_back(t);
    tok_alone.push_back(t);
    pos.push_back(static_cast<int>(prompt.size()) - 1);
  }
  std::vector<ModelState*> states;
  for (auto& s : batched) states.push_back(s.get());
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("draft step " + std::to_string(step));
    std::vector<ForwardResult> got(kSessions);
    std::vector<ForwardResult*> outs;
    for (ForwardResult& r : got) {
      r.want_logits = true;
      outs.push_back(&r);
    }
    ASSERT_TRUE(
        model_->MtpDraftBatch(states, h_batched, tok_batched, pos, outs).ok());
    for (int i = 0; i < kSessions; ++i) {
      ForwardResult want;
      want.want_logits = true;
      ASSERT_TRUE(model_
                      ->MtpDraft(alone[i].get(), h_alone[i], tok_alone[i],
                                 pos[i], &want)
                      .ok());
      EXPECT_EQ(got[i].argmax, want.argmax) << "session " << i;
      EXPECT_TRUE(SameBytes(got[i].logits, want.logits)) << "session " << i;
      EXPECT_TRUE(SameBytes(got[i].hidden, want.hidden)) << "session " << i;
      // Chain: the head's own hidden and drafted token, one row on.
      h_batched[i] = got[i].hidden;
      h_alone[i] = want.hidden;
      tok_batched[i] = got[i].argmax[0];
      tok_alone[i] = want.argmax[0];
      ++pos[i];
    }
  }
  // Refusals: a session twice, a position leaving a gap.
  std::vector<ForwardResult> r(2);
  std::vector<ForwardResult*> two = {&r[0], &r[1]};
  std::vector<ModelState*> dup = {states[0], states[0]};
  EXPECT_EQ(model_
                ->MtpDraftBatch(dup, {h_batched[0], h_batched[0]}, {1, 2},
                                {pos[0], pos[0]}, two)
                .code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<ModelState*> pair = {states[0], states[1]};
  EXPECT_EQ(model_
                ->MtpDraftBatch(pair, {h_batched[0], h_batched[1]}, {1, 2},
                                {pos[0], pos[1] + 5}, two)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// MtpBatch with several rows per session (the rows a session owes, then a
// draft step, as a speculative round's first draft pass runs them) against
// MtpForward of the owed rows and MtpDraft of the step alone: the step's row
// byte for byte, and a further draft step on each (which attends over every
// row the pass wrote) too.
TEST_P(VerifyBatchTest, MtpBatchOfOwedRowsAndADraftEqualsEachAlone) {
  if (!model_->has_mtp()) GTEST_SKIP() << "no MTP head";
  constexpr int kSessions = 5;
  std::vector<std::unique_ptr<ModelState>> batched, alone;
  std::vector<std::vector<float>> owed_h, draft_h;
  std::vector<std::vector<int32_t>> owed_tok;
  std::vector<int32_t> draft_tok;
  std::vector<int> first_row;
  for (int i = 0; i < kSessions; ++i) {
    // The last `owed` MTP rows of the prompt are left unwritten, a different
    // count per session (none for the first), so that one pass mixes
    // sessions with and without owed rows.
    const std::vector<int32_t> prompt = RandomTokens(3 + 4 * i);
    const int n = static_cast<int>(prompt.size()) - 1;
    const int owed = std::min(i, n);
    std::vector<float> hidden;
    for (auto* v : {&batched, &alone}) {
      v->push_back(NewState());
      hidden = PrefillHiddens(v->back().get(), prompt);
      ASSERT_TRUE(
          model_
              ->MtpForward(v->back().get(),
                           absl::MakeConstSpan(hidden.data(), (n - owed) * H_),
                           absl::MakeConstSpan(prompt.data() + 1, n - owed), 0,
                           nullptr)
              .ok());
    }
    first_row.push_back(n - owed);
    owed_h.emplace_back(hidden.begin() + (n - owed) * H_,
                        hidden.begin() + n * H_);
    owed_tok.emplace_back(prompt.begin() + 1 + (n - owed), prompt.end());
    draft_h.emplace_back(hidden.end() - H_, hidden.end());
    draft_tok.push_back(RandomTokens(1)[0]);
  }
  std::vector<std::vector<float>> all_h(kSessions);
  std::vector<std::vector<int32_t>> all_tok(kSessions);
  std::vector<Model::MtpRows> rows;
  std::vector<ModelState*> states;
  std::vector<ForwardResult> got(kSessions);
  std::vector<ForwardResult*> outs;
  for (int i = 0; i < kSessions; ++i) {
    all_h[i] = owed_h[i];
    all_h[i].insert(all_h[i].end(), draft_h[i].begin(), draft_h[i].end());
    all_tok[i] = owed_tok[i];
    all_tok[i].push_back(draft_tok[i]);
    rows.push_back({first_row[i], all_h[i], all_tok[i]});
    states.push_back(batched[i].get());
    got[i].want_logits = true;
    outs.push_back(&got[i]);
  }
  ASSERT_TRUE(model_->MtpBatch(states, rows, outs).ok());
  for (int i = 0; i < kSessions; ++i) {
    SCOPED_TRACE("session " + std::to_string(i));
    if (!owed_tok[i].empty()) {
      ASSERT_TRUE(model_
                      ->MtpForward(alone[i].get(), owed_h[i], owed_tok[i],
                                   first_row[i], nullptr)
                      .ok());
    }
    const int draft_row = first_row[i] + static_cast<int>(owed_tok[i].size());
    ForwardResult want;
    want.want_logits = true;
    ASSERT_TRUE(model_
                    ->MtpDraft(alone[i].get(), draft_h[i], draft_tok[i],
                               draft_row, &want)
                    .ok());
    EXPECT_EQ(got[i].argmax, want.argmax);
    EXPECT_TRUE(SameBytes(got[i].logits, want.logits)) << "logits";
    EXPECT_TRUE(SameBytes(got[i].hidden, want.hidden)) << "hidden";
    EXPECT_EQ(batched[i]->mtp_length(), alone[i]->mtp_length());
    // The next draft step attends over every row written above.
    ForwardResult next_got, next_want;
    next_got.want_logits = next_want.want_logits = true;
    ASSERT_TRUE(model_
                    ->MtpDraft(batched[i].get(), got[i].hidden,
                               got[i].argmax[0], draft_row + 1, &next_got)
                    .ok());
    ASSERT_TRUE(model_
                    ->MtpDraft(alone[i].get(), want.hidden, want.argmax[0],
                               draft_row + 1, &next_want)
                    .ok());
    EXPECT_TRUE(SameBytes(next_got.logits, next_want.logits)) << "next step";
  }
  // Refusals: more rows than a pass holds, a gap.
  std::vector<float> many_h(static_cast<size_t>(Model::kMaxRows + 1) * H_);
  std::vector<int32_t> many_tok(Model::kMaxRows + 1, 1);
  ForwardResult r;
  ForwardResult* one_out[] = {&r};
  ModelState* one[] = {states[0]};
  const Model::MtpRows too_many[] = {{0, many_h, many_tok}};
  EXPECT_EQ(model_->MtpBatch(one, too_many, one_out).code(),
            absl::StatusCode::kInvalidArgument);
  const Model::MtpRows gap[] = {
      {states[0]->mtp_length() + 1, draft_h[0], {&draft_tok[0], 1}}};
  EXPECT_EQ(model_->MtpBatch(one, gap, one_out).code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Models, VerifyBatchTest,
                         ::testing::ValuesIn(testing::DefaultAndTestModels()),
                         testing::PathParamName);

}  // namespace
}  // namespace specserve::model
