// The tensor-core tile layout of a bf16 weight (WeightLayout::kTensorCoreTiles,
// kernels/types.h): the order in which the tensor-core matmul (matmul_mma.cu)
// reads a weight, so that its loads stream contiguous memory.
//
// The matmul reads W[rows][cols] in units of (output tile of kTiledRows rows,
// k step of kTiledStepK). Within a step, warp w takes rows 16w .. 16w+15 of
// the tile and lane (g = lane/4, q = lane%4) loads 16 k (k = 16q .. 16q+15 of
// the step) of rows g and g+8, as two 16-byte chunks per row: 4 chunks per
// lane, slot = (row half: g or g+8)·2 + (which 8 of the 16 k). In this
// layout a warp's step is 128 chunks in a row (2 KB), [slot][lane], steps
// follow one another within a tile and tiles one another:
//
//   chunk(row, k) = ((tile · tile_steps + step) · kTiledWarps + warp) · 128
//                   + slot · 32 + lane
//
// with k a multiple of 8 and each chunk holding W[row][k .. k+8). A block's
// run of steps (a part of the matmul's plan) is thus one contiguous range.
// Rows past the matrix (to a whole tile) and k past cols (to a whole step)
// are zeros. The matmul loads the same values into the same registers as it
// would from row-major rows, so the layout changes its speed (DRAM pages
// and channels), not its bits.
#ifndef SPECSERVE_KERNELS_CUDA_TILED_WEIGHT_CUH_
#define SPECSERVE_KERNELS_CUDA_TILED_WEIGHT_CUH_

#include <cstdint>

namespace specserve::kernels::cuda {

constexpr int kTiledWarps = 8;
constexpr int kTiledRows = kTiledWarps * 16;  // rows per tile
constexpr int kTiledStepK = 64;               // k per step
constexpr int kTiledStepChunks =
    kTiledWarps * 128;  // 16-byte chunks per tile step

__host__ __device__ constexpr int64_t TiledSteps(int64_t cols) {
  return (cols + kTiledStepK - 1) / kTiledStepK;
}

// Bytes of a [rows][cols] bf16 weight in the tile layout (padding included).
__host__ __device__ constexpr int64_t TiledBytes(int64_t rows, int64_t cols) {
  return (rows + kTiledRows - 1) / kTiledRows * TiledSteps(cols) *
         kTiledStepChunks * 16;
}

// Chunks from a lane's chunk of row g to its next 8 k (slot + 1), and to
// the same k of row g + 8 (slot + 2).
constexpr int kTiledNextK = 32;
constexpr int kTiledRowPlus8 = 64;

// Slot 0's chunk of lane (g, q) (lane = 4g + q) of `warp` in tile step
// `tile_step` (tile · tile_steps + step): W[16·warp + g][16·q .. 16·q + 8)
// of that step.
__host__ __device__ constexpr int64_t TiledLaneChunk(int64_t tile_step,
                                                     int warp, int g, int q) {
  return (tile_step * kTiledWarps + warp) * 128 + g * 4 + q;
}

// The chunk holding W[row][k .. k+8) (k a multiple of 8).
__host__ __device__ constexpr int64_t TiledChunk(int64_t tile_steps,
                                                 int64_t row, int64_t k) {
  const int64_t tile = row / kTiledRows;
  const int rr = static_cast<int>(row % kTiledRows);
  const int warp = rr / 16, half = (rr / 8) % 2, g = rr % 8;
  const int64_t step = k / kTiledStepK;
  const int kk = static_cast<int>(k % kTiledStepK);
  const int q = kk / 16, h = (kk / 8) % 2;
  return TiledLaneChunk(tile * tile_steps + step, warp, g, q) +
         half * kTiledRowPlus8 + h * kTiledNextK;
}

// The element index of W[row][k] in the tile layout.
__host__ __device__ constexpr int64_t TiledElement(int64_t tile_steps,
                                                   int64_t row, int64_t k) {
  return TiledChunk(tile_steps, row, k - k % 8) * 8 + k % 8;
}

}  // namespace specserve::kernels::cuda

#endif  // SPECSERVE_KERNELS_CUDA_TILED_WEIGHT_CUH_
