// RmsNorm and GatedRmsNorm (kernels/rms_norm.h): one warp per vector.
// Σx² is accumulated in double (x·x is exact in double) per lane over
// i ≡ lane (mod 32), then a xor butterfly; as on the CPU the mean is rounded
// to float and inv = 1/sqrt(mean + eps) in fp32, so inv almost always
// matches the CPU bit for bit. The per-vector work depends only on dim.
// Vectors of dim >= kBlockDim (the hidden-size norms) get a whole block
// instead: one warp walking 5120 floats is latency-bound (~55 us per call
// on the H200); 256 threads each sum i ≡ tid (mod 256), the warps reduce by
// butterfly and warp 0..7 partials add in order (still a function of dim).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"

namespace specserve::kernels::cuda {
namespace {

constexpr int kWarps = 8;

__device__ __forceinline__ float InvRms(const float* x, int64_t dim, float eps,
                                        int lane) {
  double ss = 0.0;
  for (int64_t i = lane; i < dim; i += 32) {
    const double v = x[i];
    ss = __dadd_rn(ss, __dmul_rn(v, v));
  }
  ss = WarpSumD(ss);
  const float mean = static_cast<float>(ss / static_cast<double>(dim));
  return 1.0f / sqrtf(__fadd_rn(mean, eps));
}

__global__ void __launch_bounds__(kWarps * 32) RmsNormKernel(RmsNormParams p) {
  PdlBegin();
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (r >= p.rows) return;
  const float* x = p.x + r * p.x_stride;
  float* y = p.y + r * p.y_stride;
  const float inv = InvRms(x, p.dim, p.eps, lane);
  // Every lane has read all of its x before any lane writes y (the
  // butterfly above is a warp-wide exchange), so y == x is safe.
  for (int64_t i = lane; i < p.dim; i += 32) {
    const float w = p.plus_one ? __fadd_rn(1.0f, p.weight[i]) : p.weight[i];
    y[i] = __fmul_rn(__fmul_rn(x[i], inv), w);
  }
}

constexpr int64_t kBlockDim = 1024;
constexpr int kBlockThreads = 256;

__global__ void __launch_bounds__(kBlockThreads) RmsNormRowKernel(RmsNormParams p) {
  PdlBegin();
  __shared__ double sm_part[kBlockThreads / 32];
  __shared__ float sm_inv;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t r = blockIdx.x;
  const float* x = p.x + r * p.x_stride;
  float* y = p.y + r * p.y_stride;
  double ss = 0.0;
#pragma unroll 4
  for (int64_t i = threadIdx.x; i < p.dim; i += kBlockThreads) {
    const double v = x[i];
    ss = __dadd_rn(ss, __dmul_rn(v, v));
  }
  ss = WarpSumD(ss);
  if (lane == 0) sm_part[warp] = ss;
  __syncthreads();  // also: every x read above precedes any y write below
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kBlockThreads / 32; ++w) total = __dadd_rn(total, sm_part[w]);
    const float mean = static_cast<float>(total / static_cast<double>(p.dim));
    sm_inv = 1.0f / sqrtf(__fadd_rn(mean, p.eps));
  }
  __syncthreads();
  const float inv = sm_inv;
  for (int64_t i = threadIdx.x; i < p.dim; i += kBlockThreads) {
    const float w = p.plus_one ? __fadd_rn(1.0f, p.weight[i]) : p.weight[i];
    y[i] = __fmul_rn(__fmul_rn(x[i], inv), w);
  }
}

__global__ void __launch_bounds__(kWarps * 32)
    GatedRmsNormKernel(GatedRmsNormParams p) {
  PdlBegin();
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (r >= p.rows) return;
  const float* x = p.x + r * p.x_stride;
  const float* z = p.z + (p.z_group > 0 ? (r / p.z_group) * p.z_group_stride +
                                               (r % p.z_group) * p.z_stride
                                         : r * p.z_stride);
  float* y = p.y + r * p.y_stride;
  const float inv = InvRms(x, p.dim, p.eps, lane);
  for (int64_t i = lane; i < p.dim; i += 32) {
    y[i] = __fmul_rn(__fmul_rn(p.weight[i], __fmul_rn(x[i], inv)), Silu(z[i]));
  }
}

}  // namespace

absl::Status LaunchRmsNorm(const RmsNormParams& p, cudaStream_t stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (p.dim >= kBlockDim) {  // chosen by dim only: row invariance holds
    if (p.rows > 0x7fffffff) return absl::InvalidArgumentError("rms_norm: too many rows");
    LaunchPdl(RmsNormRowKernel, static_cast<unsigned>(p.rows), kBlockThreads, 0, stream, p);
    return LaunchStatus("rms_norm launch");
  }
  const int64_t blocks = CeilDiv(p.rows, kWarps);
  if (blocks > 0x7fffffff) return absl::InvalidArgumentError("rms_norm: too many rows");
  LaunchPdl(RmsNormKernel, static_cast<unsigned>(blocks), kWarps * 32, 0, stream, p);
  return LaunchStatus("rms_norm launch");
}

absl::Status LaunchGatedRmsNorm(const GatedRmsNormParams& p, cudaStream_t stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  const int64_t blocks = CeilDiv(p.rows, kWarps);
  if (blocks > 0x7fffffff) {
    return absl::InvalidArgumentError("gated_rms_norm: too many rows");
  }
  LaunchPdl(GatedRmsNormKernel, static_cast<unsigned>(blocks), kWarps * 32, 0, stream, p);
  return LaunchStatus("gated_rms_norm launch");
}

}  // namespace specserve::kernels::cuda
