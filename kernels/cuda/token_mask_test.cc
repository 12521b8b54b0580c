// MaskTokens on the device against its definition (kernels/token_mask.h),
// bit for bit, at the real vocabulary's width and odd ones; SampleRows over
// the masked rows against ChooseToken (the same token but where a long sum's
// order moves a boundary, as sample_rows_test allows). Skips without a CUDA
// device.
#include <iostream>
#include <tuple>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/token_mask_check.h"

namespace specserve::kernels::cuda {
namespace {

TEST(TokenMaskCuda, MatchesTheDefinition) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  auto be = CreateCudaBackend(0);
  ASSERT_TRUE(be.ok()) << be.status();
  int draws = 0, differ = 0;
  for (auto [rows, cols, stride] :
       {std::tuple<int, int, int>{64, 248320, 248320},
        {9, 1001, 1003},
        {4, 33, 40},
        {3, 151936, 151937}}) {
    testing::CheckTokenMasks(be->get(), rows, cols, stride, 11 + cols, &draws,
                             &differ);
  }
  std::cout << differ << " of " << draws
            << " draws differ from the host's ChooseToken\n";
  EXPECT_LE(differ * 1000, draws) << "more than 1 in 1000 draws differ";
}

}  // namespace
}  // namespace specserve::kernels::cuda
