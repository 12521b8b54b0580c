// Causal depthwise conv1d with carried state and snapshots
// (kernels/conv1d.h): one thread per channel walks the T tokens in order,
// keeping the K-entry window in registers. Per token the arithmetic is the
// CPU's: acc = Σ_j w[j]·window[j] in j order, multiply and add rounded
// separately, then silu. The state read for token t > 0 is the register
// copy of what token t−1 wrote, i.e. the same values in every mode.
// A session batch (p.states) runs one token per (channel, row) thread with
// that row's state, in place: the one-row call's instructions.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/row_formulas.cuh"

namespace specserve::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxKernel = 64;  // Validate() bound

// K > 0: compile-time kernel size (window in registers); K == 0: run-time
// size p.kernel (window in local memory).
template <int K>
__global__ void __launch_bounds__(kThreads) Conv1dKernel(Conv1dParams p) {
  PdlBegin();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= p.channels) return;
  // Tokens [t0, t1) with their state: all rows, or row blockIdx.y of a batch.
  const bool batch = p.states != nullptr;
  const int64_t t0 = batch ? blockIdx.y : 0;
  const int64_t t1 = batch ? t0 + 1 : p.rows;
  const float* state_in = batch ? p.states[t0] : p.state_in;
  float* state_out = batch ? p.states[t0] : p.state_out;
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
    if (j < s) win[j] = state_in[c * s + j];
  }
  for (int64_t t = t0; t < t1; ++t) {
    win[s] = p.x[t * p.x_stride + c];
    const float acc = ConvWindowSum(w, win, k);
    p.y[t * p.y_stride + c] = p.silu ? Silu(acc) : acc;
    float* dst = state_out + (t - t0) * p.state_out_stride + c * s;
    const bool write = p.state_out_stride != 0 || t == t1 - 1;
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
  if (p.states != nullptr && p.rows > 65535) {
    return absl::UnimplementedError(
        "conv1d: session batch of more than 65535 rows");
  }
  const dim3 blocks(static_cast<unsigned>(CeilDiv(p.channels, kThreads)),
                    p.states != nullptr ? static_cast<unsigned>(p.rows) : 1u);
  switch (p.kernel) {
    case 2:
      LaunchPdl(Conv1dKernel<2>, blocks, kThreads, 0, stream, p);
      break;
    case 3:
      LaunchPdl(Conv1dKernel<3>, blocks, kThreads, 0, stream, p);
      break;
    case 4:
      LaunchPdl(Conv1dKernel<4>, blocks, kThreads, 0, stream, p);
      break;
    default:
      LaunchPdl(Conv1dKernel<0>, blocks, kThreads, 0, stream, p);
      break;
  }
  return LaunchStatus("conv1d launch");
}

}  // namespace specserve::kernels::cuda
