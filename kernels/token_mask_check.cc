#include "kernels/token_mask_check.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/sampling/logit_adjust.h"

namespace specserve::kernels::testing {

void CheckTokenMasks(Backend* be, int64_t rows, int64_t cols, int64_t stride,
                     uint32_t seed, int* draws, int* differ) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> host(rows * stride, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      // Quantized rows hold exact ties (the first index must win).
      const float v = normal(rng);
      host[r * stride + c] = r % 4 == 3 ? static_cast<float>(int(v)) : v;
    }
  }
  // Every other row masked, in reverse order (the call's order is free).
  const int64_t W = TokenMaskWords(cols);
  std::vector<int32_t> masked;
  for (int64_t r = rows - 1; r >= 0; r -= 2) masked.push_back(r);
  std::vector<uint32_t> words(masked.size() * W);
  for (size_t i = 0; i < masked.size(); ++i) {
    // Density from ~1/1000 of the tokens to nearly all of them.
    const double keep = i % 3 == 0 ? 0.001 : i % 3 == 1 ? 0.3 : 0.97;
    std::bernoulli_distribution allow(keep);
    bool any = false;
    for (int64_t c = 0; c < cols; ++c) {
      if (allow(rng)) {
        words[i * W + c / 32] |= 1u << (c % 32);
        any = true;
      }
    }
    if (!any) words[i * W + (cols - 1) / 32] |= 1u << ((cols - 1) % 32);
  }
  auto x = be->Allocate(host.size() * sizeof(float));
  ASSERT_TRUE(x.ok()) << x.status();
  ASSERT_TRUE(
      be->CopyToDevice(x->data(), host.data(), host.size() * sizeof(float))
          .ok());
  std::vector<int32_t> argmax_init(rows, -7);
  auto am = be->Allocate(rows * sizeof(int32_t));
  ASSERT_TRUE(am.ok()) << am.status();
  ASSERT_TRUE(
      be->CopyToDevice(am->data(), argmax_init.data(), rows * sizeof(int32_t))
          .ok());
  TokenMaskParams p;
  p.rows = static_cast<int64_t>(masked.size());
  p.cols = cols;
  p.x = x->f32();
  p.x_stride = stride;
  p.row_index = masked.data();
  p.allowed = words.data();
  p.argmax = static_cast<int32_t*>(am->data());
  ASSERT_TRUE(be->MaskTokens(p).ok());

  std::vector<float> want = host;
  std::vector<int32_t> want_argmax = argmax_init;
  for (size_t i = 0; i < masked.size(); ++i) {
    want_argmax[masked[i]] =
        MaskRowAndArgmax(&want[masked[i] * stride], cols, &words[i * W]);
  }
  std::vector<float> got(host.size());
  std::vector<int32_t> got_argmax(rows);
  ASSERT_TRUE(
      be->CopyToHost(got.data(), x->data(), got.size() * sizeof(float)).ok());
  ASSERT_TRUE(
      be->CopyToHost(got_argmax.data(), am->data(), rows * sizeof(int32_t))
          .ok());
  EXPECT_EQ(got_argmax, want_argmax);
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    // Bit for bit, -inf included.
    bad += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
  }
  EXPECT_EQ(bad, 0) << "logits that differ after the mask";

  // Draws from the masked rows: the host's ChooseToken on the same row.
  const std::vector<sampling::SamplingConfig> configs = {
      {1.0f, 0, 1.0f, 0.0f},
      {0.7f, 40, 1.0f, 0.0f},
      {1.0f, 0, 0.9f, 0.0f},
      {0.8f, 0, 1.0f, 0.05f}};
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  for (const sampling::SamplingConfig& c : configs) {
    std::vector<sampling::SamplingConfig> cs(masked.size(), c);
    std::vector<float> us(masked.size());
    for (float& u : us) u = uni(rng);
    std::vector<int32_t> tokens(masked.size(), -1);
    SampleRowsParams s =
        DenseSampleRows(static_cast<int64_t>(masked.size()), x->f32(), cols,
                        masked.data(), cs.data());
    s.x_stride = stride;
    s.uniform = us.data();
    s.token = tokens.data();
    ASSERT_TRUE(be->SampleRows(s).ok());
    for (size_t i = 0; i < masked.size(); ++i) {
      const float* row = &want[masked[i] * stride];
      const int32_t host_token =
          sampling::ChooseToken(absl::MakeConstSpan(row, cols), c, us[i])
              .value();
      EXPECT_TRUE((words[i * W + tokens[i] / 32] >> (tokens[i] % 32)) & 1u)
          << "drew masked token " << tokens[i];
      ++*draws;
      *differ += tokens[i] != host_token;
    }
  }
}

}  // namespace specserve::kernels::testing
