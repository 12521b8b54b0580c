// RmsNorm and GatedRmsNorm (kernels/rms_norm.h): a warp per vector, or a
// block per vector from kRmsBlockDim on (one warp walking 5120 floats is
// latency-bound). The reduction order and the
// element formula are in rms_inv.cuh (shared with the matmul's fused norm);
// inv almost always matches the CPU bit for bit.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/rms_inv.cuh"
#include "kernels/cuda/row_formulas.cuh"

namespace specserve::kernels::cuda {
namespace {

constexpr int kWarps = 8;

// kernels::GroupedRow on the device.
__device__ __forceinline__ int64_t RowAt(int64_t r, int64_t stride,
                                         int64_t group, int64_t group_stride) {
  return group > 0 ? (r / group) * group_stride + (r % group) * stride
                   : r * stride;
}

__global__ void __launch_bounds__(kWarps * 32) RmsNormKernel(RmsNormParams p) {
  PdlBegin();
  const int lane = threadIdx.x & 31;
  const int64_t r =
      static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (r >= p.rows) return;
  const float* x = p.x + RowAt(r, p.x_stride, p.group, p.x_group_stride);
  float* y = p.y + RowAt(r, p.y_stride, p.group, p.y_group_stride);
  const float inv = WarpInvRms(x, p.dim, p.eps, lane);
  // Every lane has read all of its x before any lane writes y (the
  // butterfly above is a warp-wide exchange), so y == x is safe.
  for (int64_t i = lane; i < p.dim; i += 32)
    y[i] = NormedElem(x[i], inv, p.weight, i, p.plus_one);
}

__global__ void __launch_bounds__(kRmsBlockThreads)
    RmsNormRowKernel(RmsNormParams p) {
  PdlBegin();
  __shared__ double sm_part[kRmsBlockThreads / 32];
  __shared__ float sm_inv;
  const int64_t r = blockIdx.x;
  const float* x = p.x + RowAt(r, p.x_stride, p.group, p.x_group_stride);
  float* y = p.y + RowAt(r, p.y_stride, p.group, p.y_group_stride);
  // (BlockInvRms's barrier orders every x read before any y write: y == x is
  // safe.)
  const float inv = BlockInvRms(x, p.dim, p.eps, sm_part, &sm_inv);
  for (int64_t i = threadIdx.x; i < p.dim; i += kRmsBlockThreads) {
    y[i] = NormedElem(x[i], inv, p.weight, i, p.plus_one);
  }
}

__global__ void __launch_bounds__(kWarps * 32)
    GatedRmsNormKernel(GatedRmsNormParams p) {
  PdlBegin();
  const int lane = threadIdx.x & 31;
  const int64_t r =
      static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (r >= p.rows) return;
  const float* x = p.x + r * p.x_stride;
  const float* z = GateRow(p, r);
  float* y = p.y + r * p.y_stride;
  const float inv = WarpInvRms(x, p.dim, p.eps, lane);
  for (int64_t i = lane; i < p.dim; i += 32) {
    y[i] = __fmul_rn(__fmul_rn(p.weight[i], __fmul_rn(x[i], inv)), Silu(z[i]));
  }
}

}  // namespace

absl::Status LaunchRmsNorm(const RmsNormParams& p, cudaStream_t stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (p.dim >= kRmsBlockDim) {  // chosen by dim only: row invariance holds
    if (p.rows > 0x7fffffff)
      return absl::InvalidArgumentError("rms_norm: too many rows");
    LaunchPdl(RmsNormRowKernel, static_cast<unsigned>(p.rows), kRmsBlockThreads,
              0, stream, p);
    return LaunchStatus("rms_norm launch");
  }
  const int64_t blocks = CeilDiv(p.rows, kWarps);
  if (blocks > 0x7fffffff)
    return absl::InvalidArgumentError("rms_norm: too many rows");
  LaunchPdl(RmsNormKernel, static_cast<unsigned>(blocks), kWarps * 32, 0,
            stream, p);
  return LaunchStatus("rms_norm launch");
}

absl::Status LaunchGatedRmsNorm(const GatedRmsNormParams& p,
                                cudaStream_t stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  const int64_t blocks = CeilDiv(p.rows, kWarps);
  if (blocks > 0x7fffffff) {
    return absl::InvalidArgumentError("gated_rms_norm: too many rows");
  }
  LaunchPdl(GatedRmsNormKernel, static_cast<unsigned>(blocks), kWarps * 32, 0,
            stream, p);
  return LaunchStatus("gated_rms_norm launch");
}

}  // namespace specserve::kernels::cuda
