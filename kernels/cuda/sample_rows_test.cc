// Device sampling (CudaBackend::SampleRows) against its definition, the host
// filters and draw (sampling::FilteredProbs + SampleIndex): the same token for
// (nearly) every (row, config, uniform) at the real vocabulary's width and
// small ones: ties at the top-k cut; nuclei within the device's candidates
// and past them (found by their mass); a top-k past them; top-k and top-p
// both past them (the nucleus within the top-k's renormalized mass, up to
// and into the ties at the top-k's cut). Also row invariance, determinism, and
// bad rows refused without losing the backend. Skips without a CUDA device.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/sampling/sampling.h"

namespace specserve::kernels::cuda {
namespace {

using sampling::SamplingConfig;

class SampleRowsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
    auto b = CreateCudaBackend(0);
    ASSERT_TRUE(b.ok()) << b.status();
    gpu_ = std::move(*b);
  }

  // rows x cols logits on the device.
  Buffer Upload(const std::vector<float>& host) {
    auto buf = gpu_->Allocate(host.size() * sizeof(float));
    EXPECT_TRUE(buf.ok());
    EXPECT_TRUE(gpu_->CopyToDevice(buf->data(), host.data(),
                                   host.size() * sizeof(float))
                    .ok());
    return std::move(*buf);
  }

  // Rows rows[i] of x (cols wide) with configs[i]; no outputs set yet.
  static SampleRowsParams Rows(const Buffer& x, int64_t cols,
                               const std::vector<int32_t>& rows,
                               const std::vector<SamplingConfig>& configs) {
    return DenseSampleRows(static_cast<int64_t>(rows.size()), x.f32(), cols,
                           rows.data(), configs.data());
  }

  absl::Status Sample(const Buffer& x, int64_t cols,
                      const std::vector<int32_t>& rows,
                      const std::vector<SamplingConfig>& configs,
                      const std::vector<float>& uniforms,
                      std::vector<int32_t>* tokens) {
    SampleRowsParams p = Rows(x, cols, rows, configs);
    p.uniform = uniforms.data();
    tokens->assign(rows.size(), -1);
    p.token = tokens->data();
    return gpu_->SampleRows(p);
  }

  std::unique_ptr<Backend> gpu_;
};

int HostToken(const float* logits, int cols, const SamplingConfig& c, float u) {
  std::vector<float> probs;
  EXPECT_TRUE(sampling::FilteredProbs(logits, cols, c, &probs).ok());
  return sampling::SampleIndex(probs, u);
}

// Rows of different shapes: peaked, flat, and quantized (many exact ties).
std::vector<float> MakeRows(int rows, int cols, std::mt19937* rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r) {
    const float scale = r % 3 == 0 ? 4.0f : r % 3 == 1 ? 0.3f : 2.0f;
    for (int i = 0; i < cols; ++i) {
      float v = scale * normal(*rng);
      if (r % 3 == 2) v = std::round(v * 2.0f) / 2.0f;  // ties
      x[static_cast<size_t>(r) * cols + i] = v;
    }
  }
  return x;
}

const std::vector<SamplingConfig>& Configs() {
  static const std::vector<SamplingConfig> configs = {
      {0.8f, 0, 1.0f, 0.0f},     {1.0f, 0, 1.0f, 0.05f},
      {0.8f, 50, 0.95f, 0.0f},   {0.8f, 0, 0.9f, 0.0f},
      {2.0f, 0, 0.9f, 0.0f},     {1.0f, 20, 0.8f, 0.05f},
      {0.6f, 1, 1.0f, 0.0f},     {1.0f, 1024, 1.0f, 0.0f},
      {1.0f, 2000, 0.99f, 0.0f}, {1.3f, 7, 1.0f, 0.1f},
      {0.7f, 0, 0.5f, 0.2f},     {1.0f, 2000, 1.0f, 0.0f},
      {1.0f, 5000, 1.0f, 0.05f}, {1.5f, 0, 0.95f, 0.0f},
      {1.0f, 0, 0.999f, 0.01f},  {1.0f, 5000, 0.9f, 0.02f},
      {0.8f, 3000, 0.5f, 0.0f},  {1.0f, 3000, 0.999f, 0.0f},
  };
  return configs;
}

TEST_F(SampleRowsTest, TokensMatchTheHostDefinition) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  int draws = 0, mismatches = 0;
  for (int cols : {248320, 4097, 1000, 33}) {
    const int rows = cols > 100000 ? 6 : 12;
    const std::vector<float> x = MakeRows(rows, cols, &rng);
    const Buffer dx = Upload(x);
    for (const SamplingConfig& c : Configs()) {
      // Every row, several uniforms, in one call (rows repeat).
      std::vector<int32_t> index;
      std::vector<SamplingConfig> configs;
      std::vector<float> uniforms;
      for (int r = 0; r < rows; ++r) {
        for (int j = 0; j < 5; ++j) {
          index.push_back(r);
          configs.push_back(c);
          uniforms.push_back(j == 0 ? 0.0f : j == 1 ? 0.99999994f : uni(rng));
        }
      }
      std::vector<int32_t> got;
      ASSERT_TRUE(Sample(dx, cols, index, configs, uniforms, &got).ok());
      for (size_t i = 0; i < index.size(); ++i) {
        const int want =
            HostToken(x.data() + static_cast<size_t>(index[i]) * cols, cols,
                      configs[i], uniforms[i]);
        ++draws;
        if (got[i] != want) {
          ++mismatches;
          std::cout << "differs: cols " << cols << " row " << index[i] << " T "
                    << c.temperature << " top_k " << c.top_k << " top_p "
                    << c.top_p << " min_p " << c.min_p << " u " << uniforms[i]
                    << ": device " << got[i] << ", host " << want << "\n";
        }
      }
    }
  }
  // Sums in another order may move a draw that falls within ~1e-16 of a
  // boundary (printed above); hardly any is expected at this count.
  std::printf("device vs host sampling: %d of %d draws differ\n", mismatches,
              draws);
  EXPECT_LE(mismatches, draws / 1000);
}

TEST_F(SampleRowsTest, RowsAreInvariantAndDeterministic) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  const int rows = 37, cols = 50000;
  const std::vector<float> x = MakeRows(rows, cols, &rng);
  const Buffer dx = Upload(x);
  std::vector<int32_t> index;
  std::vector<SamplingConfig> configs;
  std::vector<float> uniforms;
  for (int r = 0; r < rows; ++r) {
    index.push_back(rows - 1 - r);
    configs.push_back(Configs()[r % Configs().size()]);
    uniforms.push_back(uni(rng));
  }
  std::vector<int32_t> all, again;
  ASSERT_TRUE(Sample(dx, cols, index, configs, uniforms, &all).ok());
  ASSERT_TRUE(Sample(dx, cols, index, configs, uniforms, &again).ok());
  EXPECT_EQ(all, again);
  for (int r = 0; r < rows; ++r) {
    std::vector<int32_t> one;
    ASSERT_TRUE(
        Sample(dx, cols, {index[r]}, {configs[r]}, {uniforms[r]}, &one).ok());
    EXPECT_EQ(one[0], all[r]) << "row " << r;
  }
}

TEST_F(SampleRowsTest, BadRowsAreRefusedAndTheBackendStaysUsable) {
  const int cols = 300;
  std::vector<float> x(2 * cols, 0.5f);
  x[cols + 17] = NAN;
  const Buffer dx = Upload(x);
  std::vector<int32_t> t;
  const SamplingConfig ok{1.0f, 0, 1.0f, 0.0f};
  absl::Status s = Sample(dx, cols, {0, 1}, {ok, ok}, {0.5f, 0.5f}, &t);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(Sample(dx, cols, {0}, {SamplingConfig{}}, {0.5f}, &t).code(),
            absl::StatusCode::kInvalidArgument);  // greedy
  EXPECT_EQ(Sample(dx, cols, {0}, {ok}, {1.0f}, &t).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Sample(dx, cols, {-1}, {ok}, {0.5f}, &t).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(Sample(dx, cols, {0}, {ok}, {0.5f}, &t).ok());
  EXPECT_EQ(t[0], HostToken(x.data(), cols, ok, 0.5f));
}

}  // namespace
}  // namespace specserve::kernels::cuda
