// Bit-identity properties of the forward (docs/DESIGN.md §3, §6), on every
// tiny model in tests/models and a larger synthetic one, with random prompts:
//  - Verify column j == single-token Decode at that position: logits,
//    hidden, recurrent and conv state, byte for byte, for T = 1..16;
//  - CommitVerified(j) leaves the state of j+1 decodes, and later decodes
//    agree byte for byte;
//  - Prefill (one pass, chunked past kMaxRows) == token-by-token Decode
//    where the backend's prefill forms are the exact ops (the CPU); on one
//    that rounds them (CUDA), within the prefill tolerance of it
//    (docs/DESIGN.md "Prefill tolerance"), and any chunking of a prompt
//    gives the same bits;
//  - results do not depend on the backend's thread count;
//  - MTP rows run together == run one by one.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/gated_delta_rule.h"
#include "worker/model/model.h"
#include "worker/model/model_test_fixture.h"
#include "worker/model/test_data.h"
#include "worker/model_files/test_util.h"

namespace specserve::model {
namespace {

using testing::SameBytes;

// A random bf16 model big enough that the thread pool splits matmuls even
// at T = 1 and attention / the delta rule at T = 16, written on first use.
constexpr char kSyntheticModel[] = "synthetic_h256";
constexpr char kSyntheticConfig[] = R"({
  "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
  "vocab_size": 2048, "hidden_size": 256, "intermediate_size": 512,
  "num_hidden_layers": 4,
  "layer_types": ["linear_attention", "full_attention", "linear_attention",
                  "full_attention"],
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
  "linear_num_key_heads": 1, "linear_num_value_heads": 2,
  "linear_key_head_dim": 128, "linear_value_head_dim": 128,
  "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6,
  "tie_word_embeddings": false, "max_position_embeddings": 1024,
  "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.25},
  "mtp_num_hidden_layers": 1
})";

std::string MakeModelDir(const std::string& param) {
  if (param.substr(0, param.find('@')) != kSyntheticModel) {
    return testing::ModelDirOf(param);
  }
  namespace mf = model_files;
  std::string name = param;  // one folder per parameter
  std::replace(name.begin(), name.end(), '@', '_');
  const std::string dir = mf::testing::FreshDir(name);
  auto config = mf::ParseModelConfig(kSyntheticConfig, "synthetic config");
  CHECK(config.ok()) << config.status();
  mf::testing::TinyModelOptions o;
  o.mtp_layers = 1;
  CHECK(mf::testing::WriteFile(dir + "/config.json", kSyntheticConfig).ok());
  CHECK(mf::testing::WriteFile(dir + "/model.safetensors",
                               mf::testing::SafetensorsBytes(
                                   mf::testing::TinyModelTensors(*config, o)))
            .ok());
  return dir;
}

std::vector<std::string> ModelParams() {
  std::vector<std::string> p = testing::TestModelDirs();
  p.push_back(kSyntheticModel);
  // Both KV cache types on every backend (the default is one of them).
  for (kernels::DType kv : {kernels::DType::kF32, kernels::DType::kBF16}) {
    p.push_back(testing::WithKvCache("tests/models/tiny_a", kv));
    p.push_back(testing::WithKvCache(kSyntheticModel, kv));
  }
  // A bf16 recurrent state (fp32 is the default, run above).
  p.push_back(testing::WithRecurrentState("tests/models/tiny_a",
                                          kernels::DType::kBF16));
  p.push_back(
      testing::WithRecurrentState(kSyntheticModel, kernels::DType::kBF16));
  return p;
}

bool AllFinite(const std::vector<float>& v) {
  for (float x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

class ExactnessTest : public testing::ModelTest {
 protected:
  ExactnessTest()
      : ModelTest({.seed = 20240611, .capacity = 256, .verify_columns = 16}) {}

  static void SetUpTestSuite() {
    dirs_ = new std::map<std::string, std::string>;
  }
  static void TearDownTestSuite() { delete dirs_; }

  // Made once per suite and parameter (the synthetic model written then).
  std::string ModelDir(const std::string& param) override {
    std::string& dir = (*dirs_)[param];
    if (dir.empty()) dir = MakeModelDir(param);
    return dir;
  }

  static std::map<std::string, std::string>* dirs_;  // param -> model dir
};

std::map<std::string, std::string>* ExactnessTest::dirs_ = nullptr;

TEST_P(ExactnessTest, VerifyColumnsEqualDecode) {
  for (int T = 1; T <= 16; ++T) {
    for (int trial = 0; trial < 3; ++trial) {
      SCOPED_TRACE("T=" + std::to_string(T) +
                   " trial=" + std::to_string(trial));
      const std::vector<int32_t> prompt =
          RandomTokens(1 + (T * 7 + trial * 5) % 23);
      const std::vector<int32_t> cols = RandomTokens(T);
      auto a = NewState(), b = NewState();
      ForwardResult r;
      ASSERT_TRUE(model_->Prefill(a.get(), prompt, {}, &r).ok());
      ASSERT_TRUE(model_->Prefill(b.get(), prompt, {}, &r).ok());
      ForwardResult v;
      ASSERT_TRUE(model_->Verify(a.get(), cols, &v).ok());
      ASSERT_EQ(v.rows, T);
      std::vector<std::vector<float>> decode_states;
      for (int j = 0; j < T; ++j) {
        ForwardResult d;
        ASSERT_TRUE(model_->Decode(b.get(), cols[j], &d).ok());
        ASSERT_TRUE(AllFinite(d.logits)) << "non-finite logits";
        EXPECT_TRUE(SameBytes(d.logits, v.logits.data() + j * V_, V_))
            << "logits col " << j;
        EXPECT_TRUE(SameBytes(d.hidden, v.hidden.data() + j * H_, H_))
            << "hidden col " << j;
        EXPECT_EQ(d.argmax[0], v.argmax[j]);
        decode_states.push_back(LinearStates(*b, -1));
        EXPECT_EQ(decode_states.back(), LinearStates(*a, j))
            << "state col " << j;
        const std::vector<float> cap = LinearStates(*a, j);
        EXPECT_TRUE(SameBytes(decode_states.back(), cap.data(), cap.size()))
            << "state bytes " << j;
      }
      // Commit a column, then both sessions continue identically.
      const int keep = (trial * 5 + T) % T;
      ASSERT_TRUE(model_->CommitVerified(a.get(), keep).ok());
      EXPECT_EQ(a->length(), static_cast<int>(prompt.size()) + keep + 1);
      const std::vector<float> committed = LinearStates(*a, -1);
      EXPECT_TRUE(
          SameBytes(decode_states[keep], committed.data(), committed.size()));
      auto c = NewState();
      ASSERT_TRUE(model_->Prefill(c.get(), prompt, {}, &r).ok());
      for (int j = 0; j <= keep; ++j)
        ASSERT_TRUE(model_->Decode(c.get(), cols[j], &r).ok());
      for (int32_t tok : RandomTokens(3)) {
        ForwardResult da, dc;
        ASSERT_TRUE(model_->Decode(a.get(), tok, &da).ok());
        ASSERT_TRUE(model_->Decode(c.get(), tok, &dc).ok());
        EXPECT_TRUE(SameBytes(da.logits, dc.logits.data(), V_))
            << "after commit";
      }
    }
  }
}

// A pass without logits (greedy decoding) gives the same argmax, hidden and
// finiteness flags as one with, and CopyLogitsRow returns the bytes the
// full copy would have held.
TEST_P(ExactnessTest, PassWithoutLogitsKeepsArgmaxAndFetchesRows) {
  const std::vector<int32_t> prompt = RandomTokens(9);
  const std::vector<int32_t> cols = RandomTokens(4);
  auto a = NewState(), b = NewState();
  ForwardResult r;
  ASSERT_TRUE(model_->Prefill(a.get(), prompt, {}, &r).ok());
  ASSERT_TRUE(model_->Prefill(b.get(), prompt, {}, &r).ok());
  ASSERT_EQ(r.finite, std::vector<int32_t>{1});

  auto c = NewState();
  ASSERT_TRUE(model_->Prefill(c.get(), prompt, {}, &r).ok());
  // Three rounds: on a backend that records, the first runs op by op, the
  // second records and the third replays (no host-side LmHead call).
  std::vector<float> row;
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    ForwardResult full, lean;
    lean.want_logits = false;
    ASSERT_TRUE(model_->Verify(a.get(), cols, &full).ok());
    ASSERT_TRUE(model_->Verify(b.get(), cols, &lean).ok());
    EXPECT_TRUE(lean.logits.empty());
    EXPECT_EQ(lean.argmax, full.argmax);
    EXPECT_EQ(lean.finite, std::vector<int32_t>(cols.size(), 1));
    EXPECT_EQ(lean.hidden, full.hidden);
    for (int j = 0; j < static_cast<int>(cols.size()); ++j) {
      ASSERT_TRUE(model_->CopyLogitsRow(j, &row).ok());
      EXPECT_TRUE(SameBytes(row, full.logits.data() + j * V_, V_))
          << "row " << j;
    }
    EXPECT_EQ(model_->CopyLogitsRow(static_cast<int>(cols.size()), &row).code(),
              absl::StatusCode::kOutOfRange);
    if (round < 2) {
      model_->DiscardVerified(a.get());
      model_->DiscardVerified(b.get());
      // A one-row pass in between: the next verify's rows are its own.
      ForwardResult one;
      ASSERT_TRUE(model_->Decode(c.get(), cols[round], &one).ok());
    }
  }
  ASSERT_TRUE(model_->CommitVerified(a.get(), 1).ok());
  ASSERT_TRUE(model_->CommitVerified(b.get(), 1).ok());

  ForwardResult dfull, dlean;
  dlean.want_logits = false;
  ASSERT_TRUE(model_->Decode(a.get(), cols[2], &dfull).ok());
  ASSERT_TRUE(model_->Decode(b.get(), cols[2], &dlean).ok());
  EXPECT_TRUE(dlean.logits.empty());
  EXPECT_EQ(dlean.argmax, dfull.argmax);
  EXPECT_EQ(dlean.finite, std::vector<int32_t>{1});
  ASSERT_TRUE(model_->CopyLogitsRow(0, &row).ok());
  EXPECT_TRUE(SameBytes(row, dfull.logits.data(), V_));
}

// max |a − b| over n values, relative to max |b|.
double RelativeError(const float* a, const float* b, int n) {
  double diff = 0, scale = 0;
  for (int i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

TEST_P(ExactnessTest, PrefillEqualsTokenByTokenDecode) {
  const bool exact = backend_->ExactPrefill();
  // 70 > kMaxRows: with all_rows the prefill runs in two chunks.
  for (int len : {1, 5, 17, Model::kMaxRows + 6}) {
    SCOPED_TRACE("prompt length " + std::to_string(len));
    const std::vector<int32_t> prompt = RandomTokens(len);
    auto a = NewState(), b = NewState();
    ForwardResult pa;
    ASSERT_TRUE(model_->Prefill(a.get(), prompt, {.all_rows = true}, &pa).ok());
    ASSERT_EQ(pa.rows, len);
    ForwardResult d;
    for (int i = 0; i < len; ++i) {
      ASSERT_TRUE(model_->Decode(b.get(), prompt[i], &d).ok());
      if (exact) {
        EXPECT_TRUE(SameBytes(d.logits, pa.logits.data() + i * V_, V_))
            << "row " << i;
      } else {
        // Each within 2e-2 of the CPU's exact logits (cuda_model_test), so
        // within 4e-2 of each other.
        EXPECT_LE(RelativeError(pa.logits.data() + i * V_, d.logits.data(), V_),
                  4e-2)
            << "row " << i;
      }
    }
    if (!exact) continue;  // the states differ within the tolerance
    EXPECT_EQ(LinearStates(*a, -1), LinearStates(*b, -1));
    // Greedy continuations agree token for token (and logit for logit).
    int32_t na = pa.argmax.back(), nb = d.argmax[0];
    for (int step = 0; step < 12; ++step) {
      ASSERT_EQ(na, nb) << "greedy step " << step;
      ForwardResult ra, rb;
      ASSERT_TRUE(model_->Decode(a.get(), na, &ra).ok());
      ASSERT_TRUE(model_->Decode(b.get(), nb, &rb).ok());
      EXPECT_TRUE(SameBytes(ra.logits, rb.logits.data(), V_));
      na = ra.argmax[0];
      nb = rb.argmax[0];
    }
  }
}

// Prefill forms are row-invariant on every backend, and the chunked delta
// rule (CUDA, dk = 128: the synthetic model) sums by chunks at absolute
// positions: passes cut at multiples of kPrefillDeltaRuleChunk give one
// pass's bits. Other cuts give the same bits on an exact backend, and stay
// within the prefill tolerance elsewhere.
TEST_P(ExactnessTest, PrefillChunkingDoesNotChangeBits) {
  constexpr int kChunk = static_cast<int>(kernels::kPrefillDeltaRuleChunk);
  const bool exact = backend_->ExactPrefill();
  const std::vector<int32_t> prompt = RandomTokens(2 * kChunk + 37);
  auto whole = NewState();
  ForwardResult w;
  ASSERT_TRUE(model_->Prefill(whole.get(), prompt, {}, &w).ok());
  for (int chunk : {1, 7, kChunk, 2 * kChunk}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    auto s = NewState();
    ForwardResult r;
    for (size_t i = 0; i < prompt.size(); i += chunk) {
      const size_t n = std::min(prompt.size() - i, size_t(chunk));
      r = ForwardResult{};
      ASSERT_TRUE(model_
                      ->Prefill(s.get(),
                                absl::MakeConstSpan(prompt).subspan(i, n), {},
                                &r)
                      .ok());
    }
    if (exact || chunk % kChunk == 0) {
      EXPECT_TRUE(SameBytes(r.logits, w.logits));
      EXPECT_TRUE(SameBytes(r.hidden, w.hidden));
      EXPECT_EQ(LinearStates(*s, -1), LinearStates(*whole, -1));
    } else {
      ASSERT_EQ(r.logits.size(), w.logits.size());
      EXPECT_LE(RelativeError(r.logits.data(), w.logits.data(),
                              static_cast<int>(w.logits.size())),
                4e-2);
    }
  }
}

TEST_P(ExactnessTest, AllHiddenEqualsAllRowsHidden) {
  const std::vector<int32_t> prompt = RandomTokens(Model::kMaxRows + 6);
  auto a = NewState(), b = NewState();
  ForwardResult ra, rb;
  std::vector<float> hidden;
  ASSERT_TRUE(model_->Prefill(a.get(), prompt, {.all_rows = true}, &ra).ok());
  PrefillOptions o;
  o.all_hidden = &hidden;
  ASSERT_TRUE(model_->Prefill(b.get(), prompt, o, &rb).ok());
  ASSERT_EQ(hidden.size(), ra.hidden.size());
  EXPECT_TRUE(SameBytes(hidden, ra.hidden.data(), hidden.size()));
  // Only the last row's logits were computed.
  ASSERT_EQ(rb.rows, 1);
  EXPECT_TRUE(SameBytes(rb.logits, ra.logits.data() + (ra.rows - 1) * V_, V_));
}

// A CPU-backend property, whatever this binary's test backend is.
TEST_P(ExactnessTest, CpuThreadCountDoesNotChangeResults) {
  kernels::cpu::CpuBackend one(kernels::cpu::CpuBackendOptions{1});
  kernels::cpu::CpuBackend two(kernels::cpu::CpuBackendOptions{2});
  auto m1 = Model::Load(dir_, &one);
  auto m2 = Model::Load(dir_, &two);
  ASSERT_TRUE(m1.ok());
  ASSERT_TRUE(m2.ok());
  const std::vector<int32_t> prompt = RandomTokens(40);
  auto s1 = (*m1)->NewState({.capacity = 64});
  auto s2 = (*m2)->NewState({.capacity = 64});
  ForwardResult r1, r2;
  ASSERT_TRUE((*m1)->Prefill(s1->get(), prompt, {.all_rows = true}, &r1).ok());
  ASSERT_TRUE((*m2)->Prefill(s2->get(), prompt, {.all_rows = true}, &r2).ok());
  EXPECT_TRUE(SameBytes(r1.logits, r2.logits.data(), r2.logits.size()));
}

TEST_P(ExactnessTest, MtpRowsTogetherEqualOneByOne) {
  if (!model_->has_mtp()) GTEST_SKIP() << "no MTP head";
  const int n = 13;
  const std::vector<int32_t> prompt = RandomTokens(n + 1);
  auto s = NewState();
  ForwardResult p;
  ASSERT_TRUE(model_->Prefill(s.get(), prompt, {.all_rows = true}, &p).ok());
  ForwardResult all;
  ASSERT_TRUE(
      model_
          ->MtpForward(s.get(), absl::MakeConstSpan(p.hidden.data(), n * H_),
                       absl::MakeConstSpan(prompt.data() + 1, n), 0, &all)
          .ok());
  EXPECT_EQ(s->mtp_length(), n);
  // Refill row by row (rewriting the same KV rows) and compare each row.
  for (int i = 0; i < n; ++i) {
    ForwardResult one;
    ASSERT_TRUE(
        model_
            ->MtpDraft(s.get(),
                       absl::MakeConstSpan(p.hidden.data() + i * H_, H_),
                       prompt[i + 1], i, &one)
            .ok());
    EXPECT_TRUE(SameBytes(one.logits, all.logits.data() + i * V_, V_))
        << "row " << i;
    EXPECT_TRUE(SameBytes(one.hidden, all.hidden.data() + i * H_, H_))
        << "row " << i;
  }
}

TEST_P(ExactnessTest, RestoreCheckpointReplaysExactly) {
  const std::vector<int32_t> prompt = RandomTokens(11), more = RandomTokens(6);
  auto s = NewState();
  ForwardResult r;
  ASSERT_TRUE(model_->Prefill(s.get(), prompt, {}, &r).ok());
  auto cp = model_->SaveCheckpoint(*s);
  ASSERT_TRUE(cp.ok()) << cp.status();
  std::vector<std::vector<float>> first;
  for (int32_t t : more) {
    ASSERT_TRUE(model_->Decode(s.get(), t, &r).ok());
    first.push_back(r.logits);
  }
  // Wander off: a verify with a partial commit, more decodes.
  ASSERT_TRUE(model_->Verify(s.get(), RandomTokens(4), &r).ok());
  ASSERT_TRUE(model_->CommitVerified(s.get(), 2).ok());
  ASSERT_TRUE(model_->Decode(s.get(), 3, &r).ok());
  ASSERT_TRUE(model_->RestoreCheckpoint(s.get(), **cp).ok());
  EXPECT_EQ(s->length(), static_cast<int>(prompt.size()));
  for (size_t i = 0; i < more.size(); ++i) {
    ASSERT_TRUE(model_->Decode(s.get(), more[i], &r).ok());
    EXPECT_TRUE(SameBytes(r.logits, first[i].data(), V_))
        << "replayed step " << i;
  }
  ASSERT_TRUE(model_->TruncateMtp(s.get(), 0).ok());
  EXPECT_EQ(s->mtp_length(), 0);
}

TEST_P(ExactnessTest, RejectsBadInput) {
  auto s = NewState(8);
  ForwardResult r;
  EXPECT_EQ(model_->Prefill(s.get(), {V_}, {}, &r).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->Prefill(s.get(), RandomTokens(9), {}, &r).code(),
            absl::StatusCode::kOutOfRange);
  ASSERT_TRUE(model_->Prefill(s.get(), RandomTokens(6), {}, &r).ok());
  EXPECT_EQ(model_->Verify(s.get(), RandomTokens(3), &r).code(),
            absl::StatusCode::kOutOfRange);
  ASSERT_TRUE(model_->Verify(s.get(), RandomTokens(2), &r).ok());
  EXPECT_EQ(model_->Decode(s.get(), 0, &r).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(model_->CommitVerified(s.get(), 2).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(model_->CommitVerified(s.get(), 1).ok());
  EXPECT_EQ(s->length(), 8);
  EXPECT_EQ(model_->Decode(s.get(), 0, &r).code(),
            absl::StatusCode::kOutOfRange);
}

INSTANTIATE_TEST_SUITE_P(TestModels, ExactnessTest,
                         ::testing::ValuesIn(ModelParams()),
                         testing::PathParamName);

}  // namespace
}  // namespace specserve::model
