// SwiGLU (kernels/swiglu.h): out = silu(gate) ⊙ up, one thread per element.
// out may alias gate or up: each element is read and written by one thread.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"

namespace specserve::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) SwigluKernel(SwigluParams p) {
  PdlBegin();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= p.dim) return;
  for (int64_t t = blockIdx.y; t < p.rows; t += gridDim.y) {
    const float g = p.gate[t * p.gate_stride + i];
    const float u = p.up[t * p.up_stride + i];
    p.out[t * p.out_stride + i] = SwigluElem(g, u);
  }
}

}  // namespace

absl::Status LaunchSwiglu(const SwigluParams& p, cudaStream_t stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  const dim3 grid(static_cast<unsigned>(CeilDiv(p.dim, kThreads)),
                  static_cast<unsigned>(p.rows < 65535 ? p.rows : 65535));
  LaunchPdl(SwigluKernel, grid, kThreads, 0, stream, p);
  return LaunchStatus("swiglu launch");
}

}  // namespace specserve::kernels::cuda
