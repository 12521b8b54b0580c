// Fills device memory with reproducible pseudo-random weights (a hash of
// the element index and a seed): benchmark models whose weights are made on
// the GPU instead of read from a checkpoint. Not used by the model forward.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"

namespace specserve::kernels::cuda {
namespace {

__device__ __forceinline__ uint32_t Hash(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

template <DType D>
__global__ void FillKernel(void* dst, int64_t n, uint64_t seed, float scale) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    // Uniform in [-scale, scale).
    const float u =
        (Hash(seed * 0x9e3779b97f4a7c15ull + i) >> 8) * (1.0f / 8388608.0f) -
        1.0f;
    const float v = u * scale;
    if constexpr (D == DType::kF32) {
      static_cast<float*>(dst)[i] = v;
    } else if constexpr (D == DType::kBF16) {
      static_cast<uint16_t*>(dst)[i] =
          static_cast<uint16_t>(__float_as_uint(v) >> 16);
    } else {
      static_cast<__half*>(dst)[i] = __float2half_rn(v);
    }
  }
}

}  // namespace

absl::Status LaunchFillRandom(DType dtype, void* dst, int64_t n, uint64_t seed,
                              float scale, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>(CeilDiv(n, threads), 132 * 16);
  const dim3 grid(static_cast<unsigned>(blocks));
  switch (dtype) {
    case DType::kF32:
      FillKernel<DType::kF32>
          <<<grid, threads, 0, stream>>>(dst, n, seed, scale);
      break;
    case DType::kBF16:
      FillKernel<DType::kBF16>
          <<<grid, threads, 0, stream>>>(dst, n, seed, scale);
      break;
    case DType::kF16:
      FillKernel<DType::kF16>
          <<<grid, threads, 0, stream>>>(dst, n, seed, scale);
      break;
  }
  return LaunchStatus("fill random launch");
}

}  // namespace specserve::kernels::cuda
