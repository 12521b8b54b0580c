// Row-major bf16 weight -> the tensor-core tile layout (tiled_weight.cuh).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/tiled_weight.cuh"

namespace specserve::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// One thread per 16-byte chunk of the source; `dst` is zero on entry (the
// padding stays zero).
__global__ void __launch_bounds__(kThreads)
    TileWeightKernel(const uint4* __restrict__ src, int64_t rows, int64_t cols,
                     uint4* dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t chunks_per_row = cols / 8;
  if (i >= rows * chunks_per_row) return;
  const int64_t row = i / chunks_per_row, k = (i % chunks_per_row) * 8;
  dst[TiledChunk(TiledSteps(cols), row, k)] = src[i];
}

}  // namespace

bool TilesForTensorCores(DType dtype, int64_t cols) {
  return dtype == DType::kBF16 && cols % 8 == 0;
}

size_t TiledWeightBytes(int64_t rows, int64_t cols) {
  return static_cast<size_t>(TiledBytes(rows, cols));
}

absl::Status LaunchTileWeight(const void* src, int64_t rows, int64_t cols,
                              void* dst, cudaStream_t stream) {
  if (rows < 1 || cols < 1 || cols % 8 != 0 ||
      reinterpret_cast<uintptr_t>(src) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(dst) % 16 != 0) {
    return absl::InvalidArgumentError(
        "tile weight: needs a non-empty bf16 matrix with cols % 8 == 0, "
        "16-byte aligned");
  }
  const int64_t chunks = rows * (cols / 8);
  const int64_t blocks = CeilDiv(chunks, kThreads);
  if (blocks > 0x7fffffff)
    return absl::InvalidArgumentError("tile weight: matrix too large");
  TileWeightKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const uint4*>(src), rows, cols, static_cast<uint4*>(dst));
  return LaunchStatus("tile weight launch");
}

}  // namespace specserve::kernels::cuda
