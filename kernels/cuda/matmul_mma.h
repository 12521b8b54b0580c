// The tensor-core path of the CUDA matmul (bf16 weights; see matmul_mma.cu
// for the math and the fixed reduction order). LaunchMatmul (matmul.cu)
// routes here when MmaMatmulApplies; the plan is exposed for benchmarks.
#ifndef SPECSERVE_KERNELS_CUDA_MATMUL_MMA_H_
#define SPECSERVE_KERNELS_CUDA_MATMUL_MMA_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/matmul.h"
#include "kernels/cuda/ops.h"

namespace specserve::kernels::cuda {

// bf16 weights, in % 8 == 0 and 16-byte aligned rows: depends on the weight
// only, so every call on one weight takes the same path.
bool MmaMatmulApplies(const MatmulParams& p);

// How the K range is cut (a function of the shape only).
struct MmaPlan {
  int64_t tiles = 0;      // output tiles (128 outputs each)
  int64_t kseg = 0;       // K per segment (a multiple of 256)
  int64_t segs = 0;       // segments
};
MmaPlan PlanMmaMatmul(int64_t in, int64_t out);

// Benchmarks only: every plan made after this uses about `segs` K segments
// (<= 0: back to the plan's own choice); changes the reduction order of
// later calls.
void SetMmaMatmulSegsForBenchmark(int segs);

// Ints of zeroed device memory LaunchMmaMatmul needs for its counters.
int64_t MmaMatmulCounters();

// `splits`: 2 or 3 bf16 terms per x element. Uses `ws` for the segment
// partial sums ([segs][tokens][out] floats; calls with more rows than fit
// run in several launches).
absl::Status LaunchMmaMatmul(const MatmulParams& p, int splits,
                             const Workspace& ws, int* counters,
                             cudaStream_t stream);

}  // namespace specserve::kernels::cuda

#endif  // SPECSERVE_KERNELS_CUDA_MATMUL_MMA_H_
