// Recorded steps (Model::set_use_graphs; Backend::BeginRecording) against
// the same steps run op by op, on the default model and every
// tests/models/tiny_* model: Decode across a position bucket, DecodeBatch,
// the MTP draft chain and Verify give the same bits either way, and a failed
// recording falls back per session until Restore. One source, one target
// per backend (test_backend.h): the CPU backend records closures, the CUDA
// backend CUDA graphs.
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "kernels/forwarding_backend.h"
#include "worker/model/model.h"
#include "worker/model/model_test_fixture.h"
#include "worker/model/test_data.h"

namespace specserve::model {
namespace {

class RecordedStepsTest : public testing::ModelTest {
 protected:
  RecordedStepsTest()
      : ModelTest({.seed = 20261130,
                   .capacity = 256,
                   .verify_columns = 8,
                   .require_recording = true}) {}
};

// Recorded steps against the same steps op by op, on the same
// model: Decode across a position bucket boundary, DecodeBatch of 3
// sessions and an MTP draft chain, logits and hiddens bit for bit.
TEST_P(RecordedStepsTest, RecordedDecodeEqualsOpByOp) {
  const int prompt_len = Model::kGraphPositionBucket - 6;
  const std::vector<int32_t> prompt = RandomTokens(prompt_len);
  auto run = [&](bool graphs, std::vector<ForwardResult>* steps) {
    model_->set_use_graphs(graphs);
    std::vector<std::unique_ptr<ModelState>> s;
    for (int i = 0; i < 3; ++i) s.push_back(NewState(model_.get(), 512));
    ForwardResult r;
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(model_
                      ->Prefill(s[i].get(),
                                absl::MakeConstSpan(prompt).subspan(i), {}, &r)
                      .ok());
    }
    int32_t next = r.argmax[0];
    for (int step = 0; step < 12; ++step) {  // positions 250..261
      ASSERT_TRUE(model_->Decode(s[0].get(), next, &r).ok());
      steps->push_back(r);
      next = r.argmax[0];
    }
    std::vector<ModelState*> all = {s[0].get(), s[1].get(), s[2].get()};
    for (int step = 0; step < 5; ++step) {
      ASSERT_TRUE(model_->DecodeBatch(all, {next, 7, 11}, &r).ok());
      steps->push_back(r);
      next = r.argmax[2];
    }
    if (!model_->has_mtp()) return;
    // A draft chain on s[1]: MTP rows 0..2 filled, then 6 draft steps.
    const std::vector<float> h(3 * H_, 0.5f);
    ASSERT_TRUE(model_->MtpForward(s[1].get(), h, {3, 4, 5}, 0, &r).ok());
    std::vector<float> hidden(r.hidden.end() - H_, r.hidden.end());
    int32_t tok = r.argmax.back();
    for (int row = 3; row < 9; ++row) {
      ASSERT_TRUE(model_->MtpDraft(s[1].get(), hidden, tok, row, &r).ok());
      steps->push_back(r);
      hidden = r.hidden;
      tok = r.argmax[0];
    }
  };
  std::vector<ForwardResult> eager, recorded;
  run(false, &eager);
  const Model::GraphStats before = model_->graph_stats();
  run(true, &recorded);
  const Model::GraphStats& st = model_->graph_stats();
  ASSERT_EQ(eager.size(), recorded.size());
  for (size_t i = 0; i < eager.size(); ++i) {
    EXPECT_EQ(eager[i].logits, recorded[i].logits) << "step " << i;
    EXPECT_EQ(eager[i].hidden, recorded[i].hidden) << "step " << i;
    EXPECT_EQ(eager[i].argmax, recorded[i].argmax) << "step " << i;
  }
  // Two buckets for one session, one for three, one draft key: each key
  // runs once op by op, is recorded on its second step and replayed from
  // then on.
  const int keys = model_->has_mtp() ? 4 : 3;
  EXPECT_EQ(st.failed - before.failed, 0);
  EXPECT_EQ(st.recorded - before.recorded, keys);
  EXPECT_EQ(st.eager - before.eager, keys);
  EXPECT_EQ(st.replayed - before.replayed,
            static_cast<int64_t>(eager.size()) - keys);
}

// Recorded Verify (per session) against op by op: rounds of 4 columns
// committing 1..4 of them, across a position bucket, and after an
// Offload/Restore (the session's recordings are dropped and remade).
TEST_P(RecordedStepsTest, RecordedVerifyEqualsOpByOp) {
  const std::vector<int32_t> prompt =
      RandomTokens(Model::kGraphPositionBucket - 9);
  auto a = NewState(model_.get(), 512), b = NewState(model_.get(), 512);
  ForwardResult ra, rb;
  ASSERT_TRUE(model_->Prefill(a.get(), prompt, {}, &ra).ok());
  ASSERT_TRUE(model_->Prefill(b.get(), prompt, {}, &rb).ok());
  const int64_t replayed = model_->graph_stats().replayed;
  int32_t next = ra.argmax[0];
  for (int round = 0; round < 8; ++round) {
    if (round == 5) {
      auto snap = model_->Offload(a.get());
      ASSERT_TRUE(snap.ok()) << snap.status();
      ASSERT_TRUE(model_->Restore(a.get(), **snap).ok());
    }
    const std::vector<int32_t> cols = {next, 11, 12, 13};
    model_->set_use_graphs(true);
    ASSERT_TRUE(model_->Verify(a.get(), cols, &ra).ok()) << "round " << round;
    model_->set_use_graphs(false);
    ASSERT_TRUE(model_->Verify(b.get(), cols, &rb).ok());
    model_->set_use_graphs(true);
    EXPECT_EQ(ra.logits, rb.logits)
        << "round " << round << " at " << a->length();
    EXPECT_EQ(ra.hidden, rb.hidden) << "round " << round;
    const int keep = round % 4;
    ASSERT_TRUE(model_->CommitVerified(a.get(), keep).ok());
    ASSERT_TRUE(model_->CommitVerified(b.get(), keep).ok());
    next = ra.argmax[keep];
  }
  EXPECT_GT(model_->graph_stats().replayed - replayed, 0) << "verify replayed";
  // The committed states match too: one more decode on each.
  ForwardResult da, db;
  ASSERT_TRUE(model_->Decode(a.get(), next, &da).ok());
  model_->set_use_graphs(false);
  ASSERT_TRUE(model_->Decode(b.get(), next, &db).ok());
  model_->set_use_graphs(true);
  EXPECT_EQ(da.logits, db.logits);
}

// Fails every recording (the backend refuses to start one) while set.
class RecordingFaults : public kernels::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  absl::Status BeginRecording() override {
    ++begins;
    if (fail) return absl::InternalError("injected recording failure");
    return ForwardingBackend::BeginRecording();
  }
  bool fail = true;
  int begins = 0;
};

// A failed recording runs the step op by op (same results), keeps that
// session off recordings (one attempt, not one per step) while others still
// record, and Restore (a resume) lets it try again.
TEST_P(RecordedStepsTest, FailedRecordingFallsBackPerSession) {
  RecordingFaults faulty(backend_.get());
  auto m = Model::Load(dir_, &faulty);
  ASSERT_TRUE(m.ok()) << m.status();
  Model& model = **m;
  const std::vector<int32_t> prompt = RandomTokens(9);
  auto a = NewState(&model), b = NewState(&model), ref = NewState(&model);
  ForwardResult r, want;
  for (ModelState* s : {a.get(), b.get(), ref.get()}) {
    ASSERT_TRUE(model.Prefill(s, prompt, {}, &r).ok());
  }
  // Decodes `token` on a (as configured) and on ref op by op; equal logits.
  auto step_a = [&](int32_t token) {
    ASSERT_TRUE(model.Decode(a.get(), token, &r).ok());
    model.set_use_graphs(false);
    ASSERT_TRUE(model.Decode(ref.get(), token, &want).ok());
    model.set_use_graphs(true);
    EXPECT_EQ(r.logits, want.logits) << "position " << a->length();
  };
  int32_t next = r.argmax[0];
  for (int step = 0; step < 6; ++step) {
    step_a(next);
    next = r.argmax[0];
  }
  EXPECT_TRUE(a->graph_fallback());
  EXPECT_EQ(faulty.begins, 1) << "one failed attempt, then op by op";
  EXPECT_EQ(model.graph_stats().failed, 1);

  faulty.fail = false;
  ForwardResult rb;
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(model.Decode(b.get(), 5 + step, &rb).ok());
  }
  EXPECT_FALSE(b->graph_fallback());
  EXPECT_EQ(model.graph_stats().recorded, 1)
      << "b records (a did not block it)";
  const int begins = faulty.begins;
  step_a(next);
  next = r.argmax[0];
  EXPECT_EQ(faulty.begins, begins) << "a still runs op by op";

  auto snap = model.Offload(a.get());
  ASSERT_TRUE(snap.ok()) << snap.status();
  ASSERT_TRUE(model.Restore(a.get(), **snap).ok());
  EXPECT_FALSE(a->graph_fallback()) << "resume resets the fallback";
  const int64_t replayed = model.graph_stats().replayed;
  step_a(next);
  EXPECT_EQ(model.graph_stats().replayed, replayed + 1)
      << "a replays after resume";
}

INSTANTIATE_TEST_SUITE_P(Models, RecordedStepsTest,
                         ::testing::ValuesIn(testing::DefaultAndTestModels()),
                         testing::PathParamName);

}  // namespace
}  // namespace specserve::model
