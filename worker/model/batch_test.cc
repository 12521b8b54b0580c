// Batched decode and session-memory properties of the forward, on every tiny
// model in tests/models and the default model (models/specserve-tiny-py), on
// the backend the target links (test_backend.h: batch_test on the CPU,
// batch_cuda_test on CUDA device 0):
//  - DecodeBatch of N = 1..16 sessions at mixed lengths == Decode of each
//    alone: logits, hidden, argmax, linear states byte for byte, and the
//    sessions continue identically alone afterwards;
//  - Offload + Restore leaves a state that behaves bit-identically (trunk,
//    verify, MTP draft) to one never offloaded; offloaded states refuse
//    forward calls;
//  - StateBytes / TrunkCheckpoint::bytes / HostStateSnapshot::bytes account
//    for every buffer; FreeDraftState releases the draft-only buffers.
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

std::vector<std::string> ModelParams() {
  std::vector<std::string> p = testing::TestModelDirs();
  p.push_back("models/specserve-tiny-py");
  for (kernels::DType kv : {kernels::DType::kF32, kernels::DType::kBF16}) {
    p.push_back(testing::WithKvCache("tests/models/tiny_a", kv));
  }
  p.push_back(testing::WithRecurrentState("tests/models/tiny_a",
                                          kernels::DType::kBF16));
  return p;
}

class BatchTest : public testing::ModelTest {
 protected:
  BatchTest()
      : ModelTest({.seed = 20240612, .capacity = 96, .verify_columns = 8}) {}

  // Decodes `tokens` on a and b, expecting identical outputs.
  void ExpectSameContinuation(ModelState* a, ModelState* b,
                              const std::vector<int32_t>& tokens) {
    for (int32_t t : tokens) {
      ForwardResult ra, rb;
      ASSERT_TRUE(model_->Decode(a, t, &ra).ok());
      ASSERT_TRUE(model_->Decode(b, t, &rb).ok());
      EXPECT_TRUE(SameBytes(ra.logits, rb.logits)) << "continuation logits";
      EXPECT_TRUE(SameBytes(ra.hidden, rb.hidden)) << "continuation hidden";
    }
  }

  // Prefills `prompt` (if any) and runs the MTP head over it, so that both
  // the trunk and the MTP KV hold rows.
  void Fill(ModelState* s, const std::vector<int32_t>& prompt) {
    if (prompt.empty()) return;
    ForwardResult r;
    ASSERT_TRUE(model_->Prefill(s, prompt, {.all_rows = true}, &r).ok());
    if (!model_->has_mtp() || prompt.size() < 2) return;
    const int n = static_cast<int>(prompt.size()) - 1;
    ASSERT_TRUE(
        model_
            ->MtpForward(s, absl::MakeConstSpan(r.hidden.data(), n * H_),
                         absl::MakeConstSpan(prompt.data() + 1, n), 0, nullptr)
            .ok());
  }
};

TEST_P(BatchTest, DecodeBatchEqualsDecodeAlone) {
  for (int n = 1; n <= 16; ++n) {
    SCOPED_TRACE("sessions " + std::to_string(n));
    std::vector<std::unique_ptr<ModelState>> batched, alone;
    std::vector<ModelState*> all;
    for (int i = 0; i < n; ++i) {
      // Mixed lengths, including an empty session now and then.
      const int len = (i == 3 ? 0 : 1 + static_cast<int>(rng_() % 40));
      const std::vector<int32_t> prompt = RandomTokens(len);
      batched.push_back(NewState());
      alone.push_back(NewState());
      Fill(batched.back().get(), prompt);
      Fill(alone.back().get(), prompt);
      all.push_back(batched.back().get());
    }
    // Step 0 and 2: every session in order. Step 1: every other session in
    // reverse order (the rest decode alone), so lengths diverge further.
    for (int step = 0; step < 3; ++step) {
      std::vector<int> members;
      for (int i = 0; i < n; ++i) {
        if (step != 1 || i % 2 == 0) members.push_back(i);
      }
      if (step == 1) std::reverse(members.begin(), members.end());
      std::vector<ModelState*> group;
      const std::vector<int32_t> tokens = RandomTokens(n);
      std::vector<int32_t> group_tokens;
      for (int i : members) {
        group.push_back(batched[i].get());
        group_tokens.push_back(tokens[i]);
      }
      ForwardResult rb;
      ASSERT_TRUE(model_->DecodeBatch(group, group_tokens, &rb).ok());
      ASSERT_EQ(rb.rows, static_cast<int>(members.size()));
      EXPECT_EQ(rb.first_position, -1);
      for (size_t j = 0; j < members.size(); ++j) {
        const int i = members[j];
        ForwardResult ra;
        ASSERT_TRUE(model_->Decode(alone[i].get(), tokens[i], &ra).ok());
        EXPECT_TRUE(SameBytes(ra.logits.data(), rb.logits.data() + j * V_, V_))
            << "logits of session " << i << " step " << step;
        EXPECT_TRUE(SameBytes(ra.hidden.data(), rb.hidden.data() + j * H_, H_))
            << "hidden of session " << i << " step " << step;
        EXPECT_EQ(ra.argmax[0], rb.argmax[j]);
        EXPECT_EQ(batched[i]->length(), alone[i]->length());
      }
      for (int i = 0; i < n; ++i) {
        if (std::find(members.begin(), members.end(), i) != members.end()) {
          continue;
        }
        ForwardResult r;
        ASSERT_TRUE(model_->Decode(batched[i].get(), tokens[i], &r).ok());
        ASSERT_TRUE(model_->Decode(alone[i].get(), tokens[i], &r).ok());
      }
    }
    for (int i = 0; i < n; ++i) {
      SCOPED_TRACE("session " + std::to_string(i));
      EXPECT_TRUE(
          SameBytes(LinearStates(*batched[i]), LinearStates(*alone[i])));
      ExpectSameContinuation(batched[i].get(), alone[i].get(), RandomTokens(2));
    }
  }
}

TEST_P(BatchTest, DecodeBatchRejectsBadInput) {
  auto a = NewState(8), b = NewState(8);
  Fill(a.get(), RandomTokens(3));
  Fill(b.get(), RandomTokens(8));  // full
  ForwardResult r;
  auto code = [&](std::vector<ModelState*> states,
                  std::vector<int32_t> tokens) {
    return model_->DecodeBatch(states, tokens, &r).code();
  };
  EXPECT_EQ(code({}, {}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({a.get()}, {1, 2}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({a.get(), a.get()}, {1, 2}),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({a.get(), nullptr}, {1, 2}),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({a.get()}, {V_}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({a.get(), b.get()}, {1, 2}), absl::StatusCode::kOutOfRange);
  std::vector<std::unique_ptr<ModelState>> many;
  std::vector<ModelState*> ptrs;
  for (int i = 0; i <= Model::kMaxRows; ++i) {
    many.push_back(NewState(2));
    ptrs.push_back(many.back().get());
  }
  EXPECT_EQ(code(ptrs, std::vector<int32_t>(ptrs.size(), 0)),
            absl::StatusCode::kInvalidArgument);
  ptrs.pop_back();
  EXPECT_TRUE(
      model_->DecodeBatch(ptrs, std::vector<int32_t>(ptrs.size(), 0), &r).ok());
  EXPECT_EQ(r.rows, Model::kMaxRows);

  auto c = NewState(8);
  Fill(c.get(), RandomTokens(2));
  ASSERT_TRUE(model_->Verify(c.get(), RandomTokens(2), &r).ok());
  EXPECT_EQ(code({a.get(), c.get()}, {1, 2}),
            absl::StatusCode::kFailedPrecondition);
  model_->DiscardVerified(c.get());
  auto snap = model_->Offload(c.get());
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ(code({a.get(), c.get()}, {1, 2}),
            absl::StatusCode::kFailedPrecondition);
  // Nothing ran: lengths are unchanged.
  EXPECT_EQ(a->length(), 3);
  EXPECT_EQ(c->length(), 2);
}

TEST_P(BatchTest, OffloadRestoreIsExact) {
  const std::vector<int32_t> prompt = RandomTokens(23);
  auto s = NewState(), t = NewState();
  Fill(s.get(), prompt);
  Fill(t.get(), prompt);
  const uint64_t resident = model_->StateBytes(*s);
  EXPECT_GT(resident, 0u);
  ForwardResult r;
  ASSERT_TRUE(model_->Verify(s.get(), RandomTokens(2), &r).ok());
  EXPECT_EQ(model_->Offload(s.get()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  model_->DiscardVerified(s.get());

  auto snap = model_->Offload(s.get());
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_TRUE(s->offloaded());
  EXPECT_EQ(model_->StateBytes(*s), 0u);
  EXPECT_GT((*snap)->bytes(), 0u);
  EXPECT_LT((*snap)->bytes(), resident);  // live rows only
  EXPECT_EQ(s->length(), t->length());
  EXPECT_EQ(s->mtp_length(), t->mtp_length());

  // Every forward call refuses.
  const absl::Status refused = model_->Decode(s.get(), 1, &r);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("session caches are offloaded"),
            std::string::npos)
      << refused;
  const auto precondition = absl::StatusCode::kFailedPrecondition;
  EXPECT_EQ(model_->Prefill(s.get(), {1, 2}, {}, &r).code(), precondition);
  EXPECT_EQ(model_->Verify(s.get(), {1, 2}, &r).code(), precondition);
  EXPECT_EQ(model_->CommitVerified(s.get(), 0).code(), precondition);
  ModelState* one = s.get();
  EXPECT_EQ(model_->DecodeBatch(absl::MakeConstSpan(&one, 1), {1}, &r).code(),
            precondition);
  if (model_->has_mtp()) {
    EXPECT_EQ(
        model_->MtpDraft(s.get(), std::vector<float>(H_), 1, 0, &r).code(),
        precondition);
  }
  EXPECT_EQ(model_->SaveCheckpoint(*s).status().code(), precondition);
  EXPECT_EQ(model_->Reset(s.get()).code(), precondition);
  EXPECT_EQ(model_->Offload(s.get()).status().code(), precondition);

  // A snapshot that does not fit is refused and the state stays offloaded.
  auto small = NewState(8);
  EXPECT_EQ(model_->Restore(small.get(), **snap).code(),
            absl::StatusCode::kInvalidArgument);
  HostStateSnapshot bad = **snap;
  bad.k.pop_back();
  EXPECT_EQ(model_->Restore(s.get(), bad).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(s->offloaded());

  ASSERT_TRUE(model_->Restore(s.get(), **snap).ok());
  EXPECT_FALSE(s->offloaded());
  EXPECT_EQ(model_->StateBytes(*s), resident);
  EXPECT_EQ(s->length(), t->length());
  EXPECT_EQ(s->mtp_length(), t->mtp_length());
  EXPECT_TRUE(SameBytes(LinearStates(*s), LinearStates(*t)));

  // A resident state of the same shape takes the snapshot in place too.
  auto u = NewState();
  Fill(u.get(), RandomTokens(5));
  ASSERT_TRUE(model_->Restore(u.get(), **snap).ok());

  // Verify columns, the MTP draft over the restored MTP rows, and decodes
  // all agree with the state that was never offloaded.
  const std::vector<int32_t> cols = RandomTokens(3);
  for (ModelState* x : {s.get(), u.get()}) {
    ForwardResult va, vb;
    ASSERT_TRUE(model_->Verify(x, cols, &va).ok());
    ASSERT_TRUE(model_->Verify(t.get(), cols, &vb).ok());
    EXPECT_TRUE(SameBytes(va.logits, vb.logits)) << "verify logits";
    model_->DiscardVerified(x);
    model_->DiscardVerified(t.get());
    if (model_->has_mtp()) {
      const std::vector<float> h(va.hidden.begin(), va.hidden.begin() + H_);
      ForwardResult da, db;
      const int pos = x->mtp_length();
      ASSERT_TRUE(model_->MtpDraft(x, h, cols[1], pos, &da).ok());
      ASSERT_TRUE(model_->MtpDraft(t.get(), h, cols[1], pos, &db).ok());
      EXPECT_TRUE(SameBytes(da.logits, db.logits)) << "mtp logits";
      ASSERT_TRUE(model_->TruncateMtp(x, pos).ok());
      ASSERT_TRUE(model_->TruncateMtp(t.get(), pos).ok());
    }
  }
  const std::vector<int32_t> more = RandomTokens(4);
  auto t2 = NewState();
  Fill(t2.get(), prompt);
  ExpectSameContinuation(s.get(), t.get(), more);
  ExpectSameContinuation(u.get(), t2.get(), more);
}

TEST_P(BatchTest, ByteAccounting) {
  const ModelConfig& c = model_->config();
  const int capacity = 40, cols = 8;
  const uint64_t f = sizeof(float);
  // KV elements are the backend's cache type (2 bytes for bf16).
  const uint64_t kv_elem = kernels::DTypeSize(model_->kv_cache_dtype());
  const uint64_t kv =
      2ull * capacity * c.num_key_value_heads * c.head_dim * kv_elem;
  // Recurrent state elements likewise (Model::recurrent_state_dtype).
  const uint64_t rec_elem = kernels::DTypeSize(model_->recurrent_state_dtype());
  const uint64_t rec = static_cast<uint64_t>(c.linear_num_value_heads) *
                       c.linear_key_head_dim * c.linear_value_head_dim *
                       rec_elem;
  const uint64_t conv =
      static_cast<uint64_t>(c.conv_dim()) * (c.linear_conv_kernel_dim - 1) * f;
  const uint64_t trunk =
      c.num_full_attention_layers() * kv + num_linear_ * (rec + conv);
  const uint64_t draft =
      num_linear_ * cols * (rec + conv) + (model_->has_mtp() ? kv : 0);
  auto s = NewState(capacity);
  EXPECT_EQ(model_->StateBytes(*s), trunk + draft);
  Fill(s.get(), RandomTokens(6));
  auto cp = model_->SaveCheckpoint(*s);
  ASSERT_TRUE(cp.ok());
  EXPECT_EQ((*cp)->bytes(), num_linear_ * (rec + conv));
  auto snap = model_->Offload(s.get());
  ASSERT_TRUE(snap.ok());
  const uint64_t rows_bytes =
      6ull * c.num_key_value_heads * c.head_dim * kv_elem;  // K or V, 6 rows
  EXPECT_EQ((*snap)->bytes(),
            c.num_full_attention_layers() * 2 * rows_bytes +
                num_linear_ * (rec + conv) +
                (model_->has_mtp() ? 2 * 5 * rows_bytes / 6 : 0));
  EXPECT_EQ(model_->StateBytes(*s), 0u);
}

TEST_P(BatchTest, FreeDraftState) {
  const std::vector<int32_t> prompt = RandomTokens(17);
  auto s = NewState(), t = NewState();
  Fill(s.get(), prompt);
  Fill(t.get(), prompt);
  const uint64_t before = model_->StateBytes(*s);
  ForwardResult r;
  ASSERT_TRUE(model_->Verify(s.get(), {1, 2}, &r).ok());
  EXPECT_EQ(model_->FreeDraftState(s.get()).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(model_->CommitVerified(s.get(), 1).ok());
  ASSERT_TRUE(model_->Decode(t.get(), 1, &r).ok());
  ASSERT_TRUE(model_->Decode(t.get(), 2, &r).ok());

  ASSERT_TRUE(model_->FreeDraftState(s.get()).ok());
  ASSERT_TRUE(model_->FreeDraftState(s.get()).ok());  // idempotent
  EXPECT_FALSE(s->has_draft_state());
  EXPECT_EQ(s->mtp_length(), 0);
  const uint64_t after = model_->StateBytes(*s);
  EXPECT_LT(after, before);
  const auto precondition = absl::StatusCode::kFailedPrecondition;
  EXPECT_EQ(model_->Verify(s.get(), {1}, &r).code(), precondition);
  EXPECT_EQ(model_->MtpDraft(s.get(), std::vector<float>(H_), 1, 0, &r).code(),
            precondition);
  EXPECT_EQ(
      model_->MtpForward(s.get(), std::vector<float>(H_), {1}, 0, &r).code(),
      precondition);

  // Plain and batched decode continue exactly, also across an offload.
  auto snap = model_->Offload(s.get());
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ((*snap)->mtp_length, 0);
  ASSERT_TRUE(model_->Restore(s.get(), **snap).ok());
  EXPECT_EQ(model_->StateBytes(*s), after);
  EXPECT_FALSE(s->has_draft_state());
  auto other = NewState();
  Fill(other.get(), RandomTokens(4));
  std::vector<ModelState*> group = {other.get(), s.get()};
  ForwardResult rb, ra;
  ASSERT_TRUE(model_->DecodeBatch(group, {5, 7}, &rb).ok());
  ASSERT_TRUE(model_->Decode(t.get(), 7, &ra).ok());
  EXPECT_TRUE(SameBytes(ra.logits.data(), rb.logits.data() + V_, V_));
  ExpectSameContinuation(s.get(), t.get(), RandomTokens(3));
}

INSTANTIATE_TEST_SUITE_P(Models, BatchTest, ::testing::ValuesIn(ModelParams()),
                         testing::PathParamName);

}  // namespace
}  // namespace specserve::model
