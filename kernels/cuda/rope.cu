// Partial rotary embedding, rotate-half, in place (kernels/rope.h): one
// thread per (row, head, i < rotary_dim/2) pair, RopeRotate
// (row_formulas.cuh): the angle formed in fp32 as position·inv_freq[i], the
// rotation written without contraction, as on the CPU; cosf/sinf are
// CUDA's accurate versions (within 2 ulp of glibc's). A session batch reads row
// t's position from p.positions[t].
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/row_formulas.cuh"

namespace specserve::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) RopeKernel(RopeParams p) {
  PdlBegin();
  const int64_t half = p.rotary_dim / 2;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= p.heads * half) return;
  const int64_t h = idx / half;
  const int64_t i = idx % half;
  const float inv_freq = p.inv_freq[i];
  for (int64_t t = blockIdx.y; t < p.rows; t += gridDim.y) {
    const float pos = RopePosition(p, t);
    float* x = p.x + t * p.row_stride + h * p.head_stride;
    float y1, y2;
    RopeRotate(x[i], x[i + half], pos, inv_freq, &y1, &y2);
    x[i] = y1;
    x[i + half] = y2;
  }
}

}  // namespace

absl::Status LaunchRope(const RopeParams& p, cudaStream_t stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (p.rotary_dim == 0) return absl::OkStatus();
  const dim3 grid(
      static_cast<unsigned>(CeilDiv(p.heads * (p.rotary_dim / 2), kThreads)),
      static_cast<unsigned>(p.rows < 65535 ? p.rows : 65535));
  LaunchPdl(RopeKernel, grid, kThreads, 0, stream, p);
  return LaunchStatus("rope launch");
}

}  // namespace specserve::kernels::cuda
