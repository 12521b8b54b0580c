// The inverse RMS of one vector and the normalised element, exactly as
// RmsNorm (rms_norm.cu) computes them. The tensor-core matmul's fused norm
// (matmul_mma.cu) uses the same functions, so a fused-norm matmul gives
// the bits of RmsNorm followed by a plain matmul.
//
// Order: Σx² is accumulated in double (x·x is exact in double). Vectors
// shorter than kRmsBlockDim take one warp: lane sums i ≡ lane (mod 32),
// then a xor butterfly. Longer ones (the hidden-size norms) take a block of
// kRmsBlockThreads: thread sums i ≡ tid (mod 256), butterflies per warp,
// then warp partials 0..7 in order. As on the CPU the mean is rounded to
// float and inv = 1/sqrt(mean + eps) in fp32. Which variant runs depends
// on dim only.
#ifndef SPECSERVE_KERNELS_CUDA_RMS_INV_CUH_
#define SPECSERVE_KERNELS_CUDA_RMS_INV_CUH_

#include "kernels/cuda/common.cuh"

namespace specserve::kernels::cuda {

constexpr int64_t kRmsBlockDim = 1024;
constexpr int kRmsBlockThreads = 256;

// 1/rms from the sum of squares: the mean rounded to float, then
// 1/sqrt(mean + eps) in fp32, as on the CPU. Every variant ends here.
__device__ __forceinline__ float InvRmsOfSumSquares(double ss, int64_t dim,
                                                    float eps) {
  const float mean = static_cast<float>(ss / static_cast<double>(dim));
  return 1.0f / sqrtf(__fadd_rn(mean, eps));
}

// Every lane of the warp returns the same value.
__device__ __forceinline__ float WarpInvRms(const float* x, int64_t dim,
                                            float eps, int lane) {
  double ss = 0.0;
  for (int64_t i = lane; i < dim; i += 32) {
    const double v = x[i];
    ss = __dadd_rn(ss, __dmul_rn(v, v));
  }
  return InvRmsOfSumSquares(WarpSumD(ss), dim, eps);
}

// WarpInvRms of a vector held in registers: v[e] is element lane + 32e
// (zero past dim); the same adds in the same order, so the same bits.
template <int E>
__device__ __forceinline__ float WarpInvRmsOfLane(const float (&v)[E],
                                                  int64_t dim, float eps,
                                                  int lane) {
  double ss = 0.0;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    if (lane + 32 * e < dim) {
      const double d = v[e];
      ss = __dadd_rn(ss, __dmul_rn(d, d));
    }
  }
  return InvRmsOfSumSquares(WarpSumD(ss), dim, eps);
}

// Σ x[i]² over this thread's elements i ≡ threadIdx.x (mod
// kRmsBlockThreads), in increasing i, in double: the block variants' order.
// The loads are issued kRmsLoadBatch at a time before any is used (a
// 5120-wide row in one round trip, not five; the order of the adds is
// unchanged). At 20 the one-token matmul keeps 0 spills (ptxas -v) because
// its piece sums load eight pieces at a time.
constexpr int kRmsLoadBatch = 20;
template <int ROWS>
__device__ __forceinline__ void ThreadSumSquaresRows(const float* x,
                                                     int64_t x_stride,
                                                     int64_t dim,
                                                     double (&ss)[ROWS]) {
#pragma unroll
  for (int r = 0; r < ROWS; ++r) ss[r] = 0.0;
  for (int64_t i0 = threadIdx.x; i0 < dim;
       i0 += kRmsLoadBatch * kRmsBlockThreads) {
    float v[ROWS][kRmsLoadBatch];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
      for (int b = 0; b < kRmsLoadBatch; ++b) {
        const int64_t i = i0 + b * kRmsBlockThreads;
        v[r][b] = i < dim ? x[r * x_stride + i] : 0.0f;
      }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
      for (int b = 0; b < kRmsLoadBatch; ++b) {
        if (i0 + b * kRmsBlockThreads < dim) {
          const double d = v[r][b];
          ss[r] = __dadd_rn(ss[r], __dmul_rn(d, d));
        }
      }
    }
  }
}
__device__ __forceinline__ double ThreadSumSquares(const float* x,
                                                   int64_t dim) {
  double ss[1];
  ThreadSumSquaresRows<1>(x, 0, dim, ss);
  return ss[0];
}

// Called by all kRmsBlockThreads threads of the block (two barriers; the
// first also orders every read of x before anything after the call).
// `sm_part` holds kRmsBlockThreads / 32 doubles.
__device__ __forceinline__ float BlockInvRms(const float* x, int64_t dim,
                                             float eps, double* sm_part,
                                             float* sm_inv) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const double ss = WarpSumD(ThreadSumSquares(x, dim));
  if (lane == 0) sm_part[warp] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kRmsBlockThreads / 32; ++w)
      total = __dadd_rn(total, sm_part[w]);
    *sm_inv = InvRmsOfSumSquares(total, dim, eps);
  }
  __syncthreads();
  return *sm_inv;
}

// BlockInvRms of rows x, x + x_stride, ... (rows <= MAXT): each row's sum
// runs in exactly BlockInvRms's order, so each gets the same bits.
// Called by all kRmsBlockThreads threads; sm_inv[r] holds row r's value
// after the call (two barriers).
template <int MAXT>
__device__ __forceinline__ void BlockInvRmsRows(
    const float* x, int64_t x_stride, int rows, int64_t dim, float eps,
    double (*sm_part)[kRmsBlockThreads / 32], float* sm_inv) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (rows <= 4) {  // rows in pairs, each pair's loads batched
    for (int r = 0; r < rows; r += 2) {
      double ss[2] = {0.0, 0.0};
      if (r + 1 < rows) {
        ThreadSumSquaresRows<2>(x + r * x_stride, x_stride, dim, ss);
      } else {
        ss[0] = ThreadSumSquares(x + r * x_stride, dim);
      }
      const double s0 = WarpSumD(ss[0]);
      const double s1 = WarpSumD(ss[1]);
      if (lane == 0) {
        sm_part[r][warp] = s0;
        if (r + 1 < rows) sm_part[r + 1][warp] = s1;
      }
    }
  } else {  // rows interleaved per i: rows x 4 loads in flight
    double ss[MAXT];
#pragma unroll
    for (int r = 0; r < MAXT; ++r) ss[r] = 0.0;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < dim; i += kRmsBlockThreads) {
#pragma unroll
      for (int r = 0; r < MAXT; ++r) {
        if (r < rows) {
          const double v = x[r * x_stride + i];
          ss[r] = __dadd_rn(ss[r], __dmul_rn(v, v));
        }
      }
    }
#pragma unroll
    for (int r = 0; r < MAXT; ++r) {
      const double s = WarpSumD(ss[r]);
      if (lane == 0 && r < rows) sm_part[r][warp] = s;
    }
  }
  __syncthreads();
  if (threadIdx.x < rows) {
    const int r = threadIdx.x;
    double total = 0.0;
    for (int w = 0; w < kRmsBlockThreads / 32; ++w)
      total = __dadd_rn(total, sm_part[r][w]);
    sm_inv[r] = InvRmsOfSumSquares(total, dim, eps);
  }
  __syncthreads();
}

// Element i of the normalised vector: (x·inv)·w, w = 1 + weight[i] when
// plus_one (two roundings, as on the CPU).
// The same with the weight's value w = weight[i] given (loaded early).
__device__ __forceinline__ float NormedElemOf(float x, float inv, float w,
                                              bool plus_one) {
  return __fmul_rn(__fmul_rn(x, inv), plus_one ? __fadd_rn(1.0f, w) : w);
}

__device__ __forceinline__ float NormedElem(float x, float inv,
                                            const float* weight, int64_t i,
                                            bool plus_one) {
  return NormedElemOf(x, inv, weight[i], plus_one);
}

}  // namespace specserve::kernels::cuda

#endif  // SPECSERVE_KERNELS_CUDA_RMS_INV_CUH_
