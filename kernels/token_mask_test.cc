// MaskTokens on the CPU backend (the default, on host copies) against its
// definition, and SampleRows over the masked rows against ChooseToken.
#include <tuple>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/token_mask_check.h"

namespace specserve::kernels {
namespace {

TEST(TokenMask, CpuMatchesTheDefinition) {
  cpu::CpuBackend be;
  for (auto [rows, cols, stride] : {std::tuple<int, int, int>{8, 1000, 1000},
                                    {5, 1001, 1003},
                                    {3, 33, 40}}) {
    int draws = 0, differ = 0;
    testing::CheckTokenMasks(&be, rows, cols, stride, 7 + cols, &draws,
                             &differ);
    EXPECT_EQ(differ, 0) << draws << " draws";
  }
}

TEST(TokenMask, RefusesBadParams) {
  cpu::CpuBackend be;
  float x[4] = {};
  int32_t argmax[2] = {};
  const int32_t twice[2] = {1, 1};
  const uint32_t words[2] = {1, 1};
  TokenMaskParams p;
  p.rows = 2;
  p.cols = 4;
  p.x = x;
  p.x_stride = 2;
  p.row_index = twice;
  p.allowed = words;
  p.argmax = argmax;
  EXPECT_EQ(be.MaskTokens(p).code(), absl::StatusCode::kInvalidArgument);
  p.x_stride = 4;
  EXPECT_EQ(be.MaskTokens(p).code(), absl::StatusCode::kInvalidArgument);
  const int32_t negative[2] = {-1, 0};
  p.row_index = negative;
  EXPECT_EQ(be.MaskTokens(p).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specserve::kernels
