// The tensor-core path of the CUDA matmul (bf16 weights; see matmul_mma.cu
// for the math and the fixed reduction order). LaunchMatmul (matmul.cu)
// routes here when MmaMatmulApplies; the plan is exposed for benchmarks.
#ifndef SPECSERVE_KERNELS_CUDA_MATMUL_MMA_H_
#define SPECSERVE_KERNELS_CUDA_MATMUL_MMA_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/ops.h"
#include "kernels/matmul.h"

namespace specserve::kernels::cuda {

// bf16 weights, in % 8 == 0 and 16-byte aligned rows: depends on the weight
// only, so every call on one weight takes the same path.
bool MmaMatmulApplies(const MatmulParams& p);

// How the work is cut (a function of the shape only): tiles × tile_steps
// (output tile, 64-k step) pairs, tile-major, in `parts` equal ranges.
struct MmaPlan {
  int64_t tiles = 0;       // output tiles (128 outputs each)
  int64_t tile_steps = 0;  // 64-k steps per tile
  int64_t parts = 0;       // equal ranges of steps (one block's work each)
  int64_t max_pieces = 0;  // at most this many K pieces per tile
};
MmaPlan PlanMmaMatmul(int64_t in, int64_t out);

// Ints of zeroed device memory LaunchMmaMatmul needs for its counters.
int64_t MmaMatmulCounters();

// `splits`: 2 or 3 bf16 terms per x element. Uses `ws` for the pieces'
// partial sums ([max_pieces][tokens][out] floats; calls with more rows than
// fit run in several launches) and, for more than 16 rows, `x_frags` for x
// split once into bf16 fragments (in/64 steps × 16 KiB at 64 rows and 2
// terms; where that does not fit, every block splits x itself: the same
// bits, slower).
absl::Status LaunchMmaMatmul(const MatmulParams& p, int splits,
                             const Workspace& ws, const Workspace& x_frags,
                             int* counters, cudaStream_t stream);

}  // namespace specserve::kernels::cuda

#endif  // SPECSERVE_KERNELS_CUDA_MATMUL_MMA_H_
