// Row reductions over logits (kernels/reduce.h): argmax (first index of the
// maximum, NaNs never win except at index 0, as the CPU loop), log-sum-exp
// and softmax with a temperature. One block per row (argmax: a cluster of
// blocks) with a fixed thread count: thread i scans columns i, i + kThreads,
// ...; partials are merged by a fixed shared-memory tree. Sums of
// exponentials are accumulated in double like the CPU's, so results match
// it to within an ulp or so.
#include <cooperative_groups.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"

namespace specserve::kernels::cuda {
namespace {

constexpr int kThreads = 512;

// Block-wide max ignoring NaN (fmaxf), result in every thread.
__device__ float BlockMax(float v, float* sm) {
  v = WarpMax(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // sm may still be read by a previous reduction
  if (lane == 0) sm[warp] = v;
  __syncthreads();
  float r = -INFINITY;
  for (int w = 0; w < kThreads / 32; ++w) r = fmaxf(r, sm[w]);
  return r;
}

// The scaled row maximum, as the CPU's RowMax (NaN ignored).
__device__ float RowMax(const float* x, int64_t cols, float scale, float* sm) {
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < cols; i += kThreads)
    m = fmaxf(m, __fmul_rn(x[i], scale));
  return BlockMax(m, sm);
}

// (a_v, a_i) vs (b_v, b_i): larger value wins, equal values the lower index.
__device__ __forceinline__ bool Better(float bv, int64_t bi, float av,
                                       int64_t ai) {
  return bv > av || (bv == av && bi < ai);
}

// Argmax: a cluster of kArgmaxSplit blocks per row, block k scanning the
// k-th slice of the columns (slices of a multiple of 4 columns, so an
// aligned row stays aligned); each block's winner goes to rank 0's shared
// memory, which picks among them. One block per [V] row would leave most of
// the GPU idle. Better is a strict order on
// (value, index), so the winner does not depend on how the row is cut.
constexpr int kArgmaxSplit = 8;

__global__ void __cluster_dims__(kArgmaxSplit, 1, 1) __launch_bounds__(kThreads)
    ArgmaxKernel(ArgmaxParams p) {
  PdlBegin();
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  // Arrive now, wait before the first write to rank 0's shared memory: a
  // block may touch another's shared memory only once that block has
  // started (racecheck flags it otherwise); the scan runs in between.
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
  __shared__ float sm_v[kThreads / 32];
  __shared__ int64_t sm_i[kThreads / 32];
  __shared__ int sm_finite;
  __shared__ float cl_v[kArgmaxSplit];  // rank 0: each block's winner
  __shared__ int64_t cl_i[kArgmaxSplit];
  __shared__ int cl_finite[kArgmaxSplit];
  const int part = static_cast<int>(cluster.block_rank());
  const int64_t r = blockIdx.x / kArgmaxSplit;
  const float* x = p.x + r * p.x_stride;
  const int64_t slice =
      (p.cols + 4 * kArgmaxSplit - 1) / (4 * kArgmaxSplit) * 4;
  const int64_t c0 = min(p.cols, part * slice);
  const int64_t c1 = min(p.cols, c0 + slice);
  if (threadIdx.x == 0) sm_finite = 1;
  __syncthreads();
  float best_v = -INFINITY;
  int64_t best_i = INT64_MAX;
  bool finite = true;
  auto visit = [&](float v, int64_t i) {
    finite = finite && isfinite(v);
    if (Better(v, i, best_v, best_i)) {  // NaN compares false: never taken
      best_v = v;
      best_i = i;
    }
  };
  // The winner does not depend on the visiting order, so 16-byte loads,
  // several in flight, may scan an aligned slice.
  int64_t scalar_from = c0;
  if (reinterpret_cast<uintptr_t>(x + c0) % 16 == 0) {
    const float4* x4 = reinterpret_cast<const float4*>(x + c0);
    const int64_t n4 = (c1 - c0) / 4;
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < n4; j += kThreads) {
      const float4 v = x4[j];
      visit(v.x, c0 + 4 * j);
      visit(v.y, c0 + 4 * j + 1);
      visit(v.z, c0 + 4 * j + 2);
      visit(v.w, c0 + 4 * j + 3);
    }
    scalar_from = c0 + 4 * n4;
  }
  for (int64_t i = scalar_from + threadIdx.x; i < c1; i += kThreads)
    visit(x[i], i);
  if (!__all_sync(kFullMask, finite) && (threadIdx.x & 31) == 0) sm_finite = 0;
  for (int m = 16; m > 0; m >>= 1) {
    const float ov = __shfl_xor_sync(kFullMask, best_v, m);
    const int64_t oi = __shfl_xor_sync(kFullMask, best_i, m);
    if (Better(ov, oi, best_v, best_i)) {
      best_v = ov;
      best_i = oi;
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sm_v[warp] = best_v;
    sm_i[warp] = best_i;
  }
  __syncthreads();
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
  if (threadIdx.x == 0) {
    for (int w = 0; w < kThreads / 32; ++w) {
      if (Better(sm_v[w], sm_i[w], best_v, best_i)) {
        best_v = sm_v[w];
        best_i = sm_i[w];
      }
    }
    cluster.map_shared_rank(cl_v, 0)[part] = best_v;
    cluster.map_shared_rank(cl_i, 0)[part] = best_i;
    cluster.map_shared_rank(cl_finite, 0)[part] = sm_finite;
  }
  // The winners are in rank 0's shared memory (and no block has left while
  // it might still be written to).
  cluster.sync();
  if (part == 0 && threadIdx.x == 0) {
    int all_finite = 1;
    for (int k = 0; k < kArgmaxSplit; ++k) {
      all_finite &= cl_finite[k];
      if (Better(cl_v[k], cl_i[k], best_v, best_i)) {
        best_v = cl_v[k];
        best_i = cl_i[k];
      }
    }
    // The CPU keeps index 0 when x[0] is NaN (nothing compares greater),
    // and when every element is NaN.
    if (isnan(x[0]) || best_i == INT64_MAX) best_i = 0;
    p.out[r] = static_cast<int32_t>(best_i);
    if (p.finite != nullptr) p.finite[r] = all_finite;
  }
}

__global__ void __launch_bounds__(kThreads) LogSumExpKernel(LogSumExpParams p) {
  PdlBegin();
  __shared__ float sm_f[kThreads / 32];
  __shared__ double sm_d[kThreads / 32];
  const int64_t r = blockIdx.x;
  const float* x = p.x + r * p.x_stride;
  const float m = RowMax(x, p.cols, p.inv_temperature, sm_f);
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < p.cols; i += kThreads) {
    const float d = __fsub_rn(__fmul_rn(x[i], p.inv_temperature), m);
    sum = __dadd_rn(sum, exp(static_cast<double>(d)));
  }
  sum = BlockSumD<kThreads>(sum, sm_d);
  if (threadIdx.x == 0) p.out[r] = __fadd_rn(m, static_cast<float>(log(sum)));
}

__global__ void __launch_bounds__(kThreads) SoftmaxKernel(SoftmaxParams p) {
  PdlBegin();
  __shared__ float sm_f[kThreads / 32];
  __shared__ double sm_d[kThreads / 32];
  const int64_t r = blockIdx.x;
  const float* x = p.x + r * p.x_stride;
  float* y = p.y + r * p.y_stride;
  const float m = RowMax(x, p.cols, p.inv_temperature, sm_f);
  // RowMax ended with a barrier after every thread's reads of x, and each
  // element below is read then written by one thread: y == x is safe.
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < p.cols; i += kThreads) {
    const float e = expf(__fsub_rn(__fmul_rn(x[i], p.inv_temperature), m));
    y[i] = e;
    sum = __dadd_rn(sum, static_cast<double>(e));
  }
  sum = BlockSumD<kThreads>(sum, sm_d);
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = threadIdx.x; i < p.cols; i += kThreads)
    y[i] = __fmul_rn(y[i], inv);
}

absl::Status CheckRows(int64_t rows, const char* op) {
  if (rows > 0x7fffffff) {
    return absl::InvalidArgumentError(std::string(op) + ": too many rows");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchArgmax(const ArgmaxParams& p, cudaStream_t stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (absl::Status s = CheckRows(p.rows * kArgmaxSplit, "argmax"); !s.ok())
    return s;
  LaunchPdl(ArgmaxKernel, static_cast<unsigned>(p.rows * kArgmaxSplit),
            kThreads, 0, stream, p);
  return LaunchStatus("argmax launch");
}

absl::Status LaunchLogSumExp(const LogSumExpParams& p, cudaStream_t stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (absl::Status s = CheckRows(p.rows, "logsumexp"); !s.ok()) return s;
  LaunchPdl(LogSumExpKernel, static_cast<unsigned>(p.rows), kThreads, 0, stream,
            p);
  return LaunchStatus("logsumexp launch");
}

absl::Status LaunchSoftmax(const SoftmaxParams& p, cudaStream_t stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (absl::Status s = CheckRows(p.rows, "softmax"); !s.ok()) return s;
  LaunchPdl(SoftmaxKernel, static_cast<unsigned>(p.rows), kThreads, 0, stream,
            p);
  return LaunchStatus("softmax launch");
}

}  // namespace specserve::kernels::cuda
