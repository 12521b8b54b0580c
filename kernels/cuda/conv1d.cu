// Causal depthwise conv1d with carried state and snapshots
// (kernels/conv1d.h): one thread per channel walks the T tokens in order,
// keeping the K-entry window in registers. Per token the arithmetic is the
// CPU's: acc = Σ_j w[j]·window[j] in j order, multiply and add rounded
// separately, then silu. The state read for token t > 0 is the register
// copy of what token t−1 wrote, i.e. the same values in every mode.
// A session batch (p.states) runs one token per (channel, row) thread with
// that row's state, in place: the one-row call's instructions.
// Many tokens into one state slot (a prefill chunk): the walk above has only
// `channels` threads, each T tokens long, so instead each thread walks a
// run of kRunTokens tokens of one channel, starting from the window it reads
// (the raw inputs before the run, or the state before token 0), and a
// second kernel writes each channel's new state. A window holds the same
// values whichever thread builds it, so every output has the walk's bits.
// Several sessions' chunks (LaunchConv1dSlices) run as the same runs, one
// grid slice per session.
#include <algorithm>

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

constexpr int kRunTokens = 32;
// Rows from which the runs pay (below, the walk is as fast).
constexpr int64_t kRunsFromRows = 64;

// Input i of channel c in the sequence [state (s entries) | x rows]: i < 0
// reads the state's entry s + i.
template <int K>
__device__ __forceinline__ float SequenceAt(const Conv1dParams& p, int64_t c,
                                            int64_t i) {
  return i < 0 ? p.state_in[c * (K - 1) + (K - 1) + i]
               : p.x[i * p.x_stride + c];
}

// Channel c's run of tokens [t0, t0 + kRunTokens) ∩ [0, p.rows).
template <int K>
__device__ __forceinline__ void Run(const Conv1dParams& p, int64_t c,
                                    int64_t t0) {
  const int64_t t1 = t0 + kRunTokens < p.rows ? t0 + kRunTokens : p.rows;
  float w[K], win[K];
#pragma unroll
  for (int j = 0; j < K; ++j) w[j] = p.weight[c * K + j];
#pragma unroll
  for (int j = 0; j < K - 1; ++j)
    win[j] = SequenceAt<K>(p, c, t0 - (K - 1) + j);
  for (int64_t t = t0; t < t1; ++t) {
    win[K - 1] = p.x[t * p.x_stride + c];
    const float acc = ConvWindowSum(w, win, K);
    p.y[t * p.y_stride + c] = p.silu ? Silu(acc) : acc;
#pragma unroll
    for (int j = 0; j < K - 1; ++j) win[j] = win[j + 1];
  }
}

// Channel c's state after the last token: inputs rows−(K−1) .. rows−1 of
// the sequence, read before written (in place: each thread owns its
// channel).
template <int K>
__device__ __forceinline__ void FinalState(const Conv1dParams& p, int64_t c) {
  float next[K - 1];
#pragma unroll
  for (int j = 0; j < K - 1; ++j)
    next[j] = SequenceAt<K>(p, c, p.rows - (K - 1) + j);
#pragma unroll
  for (int j = 0; j < K - 1; ++j) p.state_out[c * (K - 1) + j] = next[j];
}

template <int K>
__global__ void __launch_bounds__(kThreads) Conv1dRunsKernel(Conv1dParams p) {
  PdlBegin();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= p.channels) return;
  Run<K>(p, c, static_cast<int64_t>(blockIdx.y) * kRunTokens);
}

template <int K>
__global__ void __launch_bounds__(kThreads) Conv1dStateKernel(Conv1dParams p) {
  PdlBegin();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= p.channels) return;
  FinalState<K>(p, c);
}

// The runs and then the state, for the model's kernel size.
template <int K>
void LaunchRuns(const Conv1dParams& p, cudaStream_t stream) {
  const unsigned channel_blocks =
      static_cast<unsigned>(CeilDiv(p.channels, kThreads));
  LaunchPdl(
      Conv1dRunsKernel<K>,
      dim3(channel_blocks, static_cast<unsigned>(CeilDiv(p.rows, kRunTokens))),
      kThreads, 0, stream, p);
  LaunchPdl(Conv1dStateKernel<K>, dim3(channel_blocks), kThreads, 0, stream, p);
}

// Several sessions' runs in one launch (LaunchConv1dSlices): slice z of the
// grid takes its rows, inputs, outputs and state from the table, and a
// block runs what the slice's own runs launch gives it; blocks past a
// slice's runs return.
struct ConvSlices {
  int count;
  int64_t rows[kMaxLaunchSlices];
  const float* x[kMaxLaunchSlices];
  float* y[kMaxLaunchSlices];
  const float* state_in[kMaxLaunchSlices];
  float* state_out[kMaxLaunchSlices];
};

// The slice's params: p with the slice's own fields.
__device__ __forceinline__ Conv1dParams SliceOf(const Conv1dParams& p,
                                                const ConvSlices& t, int i) {
  Conv1dParams q = p;
  q.rows = t.rows[i];
  q.x = t.x[i];
  q.y = t.y[i];
  q.state_in = t.state_in[i];
  q.state_out = t.state_out[i];
  return q;
}

template <int K>
__global__ void __launch_bounds__(kThreads)
    Conv1dSliceRunsKernel(const __grid_constant__ Conv1dParams shared,
                          const __grid_constant__ ConvSlices t) {
  PdlBegin();
  const Conv1dParams p = SliceOf(shared, t, static_cast<int>(blockIdx.z));
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kRunTokens;
  if (c >= p.channels || t0 >= p.rows) return;
  Run<K>(p, c, t0);
}

template <int K>
__global__ void __launch_bounds__(kThreads)
    Conv1dSliceStateKernel(const __grid_constant__ Conv1dParams shared,
                           const __grid_constant__ ConvSlices t) {
  PdlBegin();
  const Conv1dParams p = SliceOf(shared, t, static_cast<int>(blockIdx.y));
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= p.channels) return;
  FinalState<K>(p, c);
}

// What the slices of one call share (the kernels read it from the first).
bool SameConvShape(const Conv1dParams& a, const Conv1dParams& b) {
  return a.channels == b.channels && a.kernel == b.kernel &&
         a.x_stride == b.x_stride && a.y_stride == b.y_stride &&
         a.weight == b.weight && a.silu == b.silu;
}

}  // namespace

absl::Status LaunchConv1dSlices(absl::Span<const Conv1dParams> slices,
                                cudaStream_t stream) {
  if (slices.empty()) return absl::OkStatus();
  for (const Conv1dParams& p : slices) {
    if (absl::Status s = Validate(p); !s.ok()) return s;
    if (p.states != nullptr || p.state_out_stride != 0 || p.kernel != 4 ||
        CeilDiv(p.rows, kRunTokens) > 65535) {
      return absl::UnimplementedError(
          "conv1d slices: one state slot each, kernel 4");
    }
    if (!SameConvShape(p, slices[0])) {
      return absl::InvalidArgumentError(
          "conv1d slices: the slices of one call differ in channels, kernel, "
          "strides, weights or activation");
    }
  }
  const unsigned channel_blocks =
      static_cast<unsigned>(CeilDiv(slices[0].channels, kThreads));
  return ForEachLaunchPart(slices, [&](absl::Span<const Conv1dParams> part) {
    ConvSlices t{};
    t.count = static_cast<int>(part.size());
    int64_t runs = 1;
    for (int j = 0; j < t.count; ++j) {
      t.rows[j] = part[j].rows;
      t.x[j] = part[j].x;
      t.y[j] = part[j].y;
      t.state_in[j] = part[j].state_in;
      t.state_out[j] = part[j].state_out;
      runs = std::max<int64_t>(runs, CeilDiv(part[j].rows, kRunTokens));
    }
    const unsigned count = static_cast<unsigned>(t.count);
    LaunchPdl(Conv1dSliceRunsKernel<4>,
              dim3(channel_blocks, static_cast<unsigned>(runs), count),
              kThreads, 0, stream, part[0], t);
    LaunchPdl(Conv1dSliceStateKernel<4>, dim3(channel_blocks, count), kThreads,
              0, stream, part[0], t);
    return LaunchStatus("conv1d slices launch");
  });
}

absl::Status LaunchConv1d(const Conv1dParams& p, cudaStream_t stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (p.states != nullptr && p.rows > 65535) {
    return absl::UnimplementedError(
        "conv1d: session batch of more than 65535 rows");
  }
  if (p.states == nullptr && p.state_out_stride == 0 &&
      p.rows >= kRunsFromRows && p.kernel == 4 &&
      CeilDiv(p.rows, kRunTokens) <= 65535) {
    LaunchRuns<4>(p, stream);
    return LaunchStatus("conv1d runs launch");
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
