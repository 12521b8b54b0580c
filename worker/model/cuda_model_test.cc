// The model forward on the CUDA backend (built only with --config=cuda), on
// the default model and every tests/models/tiny_* model:
//  - against the CPU backend (the oracle): every row's logits within
//    kRelTol of max |logit| (prefill rows, teacher-forced decode steps and
//    MTP rows), and the greedy token equal wherever the CPU's top-2 margin is
//    at least kNearTie.
// The exactness contract on the GPU itself (verify == decode, prefill ==
// decode, MTP rows, checkpoints) is exactness_test built for CUDA
// (//worker/model:exactness_cuda_test).
// Every test skips when no CUDA device is visible. Run by hand on a GPU
// machine from the repository root (model paths are repository-relative).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "worker/model/model.h"
#include "worker/model/test_data.h"

namespace specserve::model {
namespace {

// fp32 on both sides with different (fixed) reduction orders; the bound is
// loose on purpose: it catches wrong math, not rounding.
constexpr double kRelTol = 2e-2;  // max |Δlogit| <= kRelTol · max |cpu logit|
constexpr float kNearTie = 1e-2f;  // CPU top-2 margins below: argmax may differ

// max |got − want| / max |want| over n values (inf on NaN).
double RelError(const float* got, const float* want, size_t n) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(got[i]) || std::isnan(want[i])) return INFINITY;
    worst = std::max(worst, std::fabs(double(got[i]) - double(want[i])));
    scale = std::max(scale, std::fabs(double(want[i])));
  }
  return worst / std::max(scale, 1e-30);
}

// Top-1 minus top-2 of one row.
float Margin(const float* x, size_t n) {
  float a = -INFINITY, b = -INFINITY;
  for (size_t i = 0; i < n; ++i) {
    if (x[i] > a) {
      b = a;
      a = x[i];
    } else if (x[i] > b) {
      b = x[i];
    }
  }
  return a - b;
}

class CudaModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (kernels::cuda::CudaDeviceCount() == 0) {
      GTEST_SKIP() << "no CUDA device visible";
    }
    dir_ = testing::ModelDirOf(GetParam());
    auto g = kernels::cuda::CreateCudaBackend(0);
    ASSERT_TRUE(g.ok()) << g.status();
    gpu_ = std::move(*g);
    auto m = Model::Load(dir_, gpu_.get());
    ASSERT_TRUE(m.ok()) << dir_ << ": " << m.status();
    model_ = std::move(*m);
    const ModelConfig& c = model_->config();
    V_ = c.vocab_size;
    H_ = c.hidden_size;
  }

  // The same model on the CPU backend (only the tests that compare load it).
  void LoadCpu() {
    cpu_ = std::make_unique<kernels::cpu::CpuBackend>();
    auto m = Model::Load(dir_, cpu_.get());
    ASSERT_TRUE(m.ok()) << m.status();
    cpu_model_ = std::move(*m);
  }

  std::vector<int32_t> RandomTokens(int n) {
    return testing::RandomTokens(n, V_, &rng_);
  }

  std::unique_ptr<ModelState> NewState(Model* m, int capacity = 256) {
    return testing::NewStateOrFail(m, capacity, 8);
  }

  // Compares row r of `gpu` with row r of `cpu` (logits within kRelTol, the
  // argmax unless the CPU margin is a near tie); returns the row's error.
  double CompareRow(const ForwardResult& cpu, const ForwardResult& gpu, int r,
                    const std::string& what) {
    const float* c = cpu.logits.data() + size_t(r) * V_;
    const float* g = gpu.logits.data() + size_t(r) * V_;
    const double err = RelError(g, c, V_);
    EXPECT_LE(err, kRelTol) << what << " row " << r;
    const float margin = Margin(c, V_);
    if (margin >= kNearTie) {
      EXPECT_EQ(cpu.argmax[r], gpu.argmax[r])
          << what << " row " << r << " (cpu margin " << margin << ")";
    } else {
      ++near_ties_;
    }
    worst_ = std::max(worst_, err);
    return err;
  }

  std::string dir_;
  std::unique_ptr<kernels::Backend> gpu_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<kernels::cpu::CpuBackend> cpu_;
  std::unique_ptr<Model> cpu_model_;
  int V_ = 0, H_ = 0;
  double worst_ = 0;
  int near_ties_ = 0;
  std::mt19937 rng_{20240611};
};

TEST_P(CudaModelTest, LogitsAndGreedyMatchCpu) {
  LoadCpu();
  int rows = 0, argmax_agree = 0;
  for (int len : {1, 23, Model::kMaxRows + 6}) {
    SCOPED_TRACE("prompt length " + std::to_string(len));
    const std::vector<int32_t> prompt = RandomTokens(len);
    auto sc = NewState(cpu_model_.get()), sg = NewState(model_.get());
    ForwardResult pc, pg;
    ASSERT_TRUE(
        cpu_model_->Prefill(sc.get(), prompt, {.all_rows = true}, &pc).ok());
    ASSERT_TRUE(
        model_->Prefill(sg.get(), prompt, {.all_rows = true}, &pg).ok());
    ASSERT_EQ(pg.rows, len);
    for (int r = 0; r < len; ++r) {
      CompareRow(pc, pg, r, "prefill");
      argmax_agree += pc.argmax[r] == pg.argmax[r];
      ++rows;
    }
    // Greedy continuation, teacher-forced with the CPU's token so that one
    // near tie cannot derail the rest of the comparison.
    int32_t next = pc.argmax.back();
    for (int step = 0; step < 24; ++step) {
      ForwardResult dc, dg;
      ASSERT_TRUE(cpu_model_->Decode(sc.get(), next, &dc).ok());
      ASSERT_TRUE(model_->Decode(sg.get(), next, &dg).ok());
      CompareRow(dc, dg, 0, "decode step " + std::to_string(step));
      argmax_agree += dc.argmax[0] == dg.argmax[0];
      ++rows;
      next = dc.argmax[0];
    }
    if (model_->has_mtp() && len >= 2) {
      // MTP rows over the CPU's trunk hiddens (same inputs on both sides).
      const int m = std::min(16, len - 1);
      ForwardResult mc, mg;
      const auto h = absl::MakeConstSpan(pc.hidden.data(), size_t(m) * H_);
      const auto t = absl::MakeConstSpan(prompt.data() + 1, m);
      ASSERT_TRUE(cpu_model_->MtpForward(sc.get(), h, t, 0, &mc).ok());
      ASSERT_TRUE(model_->MtpForward(sg.get(), h, t, 0, &mg).ok());
      for (int r = 0; r < m; ++r) {
        CompareRow(mc, mg, r, "mtp");
        argmax_agree += mc.argmax[r] == mg.argmax[r];
        ++rows;
      }
    }
  }
  std::printf(
      "[ cuda-vs-cpu ] %s: %d rows, max rel logit error %.3g, argmax "
      "agreement %d/%d, near ties (margin < %g) %d\n",
      GetParam().c_str(), rows, worst_, argmax_agree, rows, double(kNearTie),
      near_ties_);
}

// A prompt longer than one prefill pass (Model::kMaxPrefillRows), whose rows
// run on the prefill forms (bf16 tensor-core matmuls and attention), stays
// within the tolerance of the CPU's exact prefill, and so do the decode steps
// that follow it.
TEST_P(CudaModelTest, LongPrefillWithinToleranceOfCpu) {
  LoadCpu();
  const int len = Model::kMaxPrefillRows + 77;
  const std::vector<int32_t> prompt = RandomTokens(len);
  auto sc = NewState(cpu_model_.get(), len + 32);
  auto sg = NewState(model_.get(), len + 32);
  ForwardResult pc, pg;
  ASSERT_TRUE(cpu_model_->Prefill(sc.get(), prompt, {}, &pc).ok());
  ASSERT_TRUE(model_->Prefill(sg.get(), prompt, {}, &pg).ok());
  CompareRow(pc, pg, 0, "long prefill, last row");
  int32_t next = pc.argmax[0];
  for (int step = 0; step < 16; ++step) {
    ForwardResult dc, dg;
    ASSERT_TRUE(cpu_model_->Decode(sc.get(), next, &dc).ok());
    ASSERT_TRUE(model_->Decode(sg.get(), next, &dg).ok());
    CompareRow(dc, dg, 0,
               "decode after the long prefill " + std::to_string(step));
    next = dc.argmax[0];
  }
  std::printf(
      "[ cuda-vs-cpu ] %s: %d-token prefill, max rel logit error %.3g\n",
      GetParam().c_str(), len, worst_);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaModelTest,
                         ::testing::ValuesIn(testing::DefaultAndTestModels()),
                         testing::PathParamName);

}  // namespace
}  // namespace specserve::model
