// Causal depthwise conv1d with carried state and snapshots
// (kernels/conv1d.h): one thread per channel walks the T tokens in order,
// keeping the K-entry window in registers. Per token the arithmetic is the
// CPU's: acc = Σ_j w[j]·window[j] in j order, multiply and add rounded
// separately, then silu. The state read for token t > 0 is the register
// copy of what token t−1 wrote, i.e. the same values in every mode.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"

namespace specserve::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxKernel = 64;  // Validate() bound

// K > 0: compile-time kernel size (window in registers); K == 0: run-time
// size p.kernel (window in local memory).
template <int K>
__global__ void __launch_bounds__(kThreads) Conv1dKernel(Conv1dParams p) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= p.channels) return;
  constexpr int kCap = K > 0 ? K : kMaxKernel;
  const int k = K > 0 ? K : static_cast<int>(p.kernel);
  const int s = k - 1;
  float w[kCap];
  float win[kCap];
#pragma unroll
  for (int j = 0; j < kCap; ++j) {
    if (j < k) w[j] = p.weight[c * k + j];
  }
#pragma unroll
  for (int j = 0; j < kCap - 1; ++j) {
    if (j < s) win[j] = p.state_in[c * s + j];
  }
  for (int64_t t = 0; t < p.rows; ++t) {
    win[s] = p.x[t * p.x_stride + c];
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kCap; ++j) {
      if (j < k) acc = __fadd_rn(acc, __fmul_rn(w[j], win[j]));
    }
    p.y[t * p.y_stride + c] = p.silu ? Silu(acc) : acc;
    float* dst = p.state_out + t * p.state_out_stride + c * s;
    const bool write = p.state_out_stride != 0 || t == p.rows - 1;
#pragma unroll
    for (int j = 0; j < kCap - 1; ++j) {
      if (j < s) {
        win[j] = win[j + 1];
        if (write) dst[j] = win[j];
      }
    }
  }
}

}  // namespace

absl::Status LaunchConv1d(const Conv1dParams& p, cudaStream_t stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  const unsigned blocks = static_cast<unsigned>(CeilDiv(p.channels, kThreads));
  switch (p.kernel) {
    case 2:
      Conv1dKernel<2><<<blocks, kThreads, 0, stream>>>(p);
      break;
    case 3:
      Conv1dKernel<3><<<blocks, kThreads, 0, stream>>>(p);
      break;
    case 4:
      Conv1dKernel<4><<<blocks, kThreads, 0, stream>>>(p);
      break;
    default:
      Conv1dKernel<0><<<blocks, kThreads, 0, stream>>>(p);
      break;
  }
  return LaunchStatus("conv1d launch");
}

}  // namespace specserve::kernels::cuda
