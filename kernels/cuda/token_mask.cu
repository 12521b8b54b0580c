// MaskTokens on the device (kernels/token_mask.h): one block per masked row.
// Thread i visits the row's float4 groups i, i + kThreads, ...: it sets the
// disallowed entries to -inf in place (writing a group back only when one of
// its four entries is disallowed) and keeps the best (value, index) of the
// masked values; a fixed shared-memory tree merges the threads' winners
// with Better, a strict order on (value, index), so the winner is the first
// index of the maximum whatever the visiting order (the CPU's loop).
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"

namespace specserve::kernels::cuda {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ bool Better(float bv, int64_t bi, float av,
                                       int64_t ai) {
  return bv > av || (bv == av && bi < ai);
}

__global__ void __launch_bounds__(kThreads)
    MaskTokensKernel(const int32_t* rows, const uint32_t* allowed,
                     int64_t words, float* x, int64_t cols, int64_t x_stride,
                     int32_t* argmax) {
  const int32_t row = rows[blockIdx.x];
  float* xr = x + row * x_stride;
  const uint32_t* bits = allowed + blockIdx.x * words;
  float best_v = -INFINITY;
  int64_t best_i = INT64_MAX;
  auto visit = [&](int64_t c) {
    float v = xr[c];
    if (((bits[c >> 5] >> (c & 31)) & 1u) == 0) {
      v = -INFINITY;
      xr[c] = v;
    }
    if (Better(v, c, best_v, best_i)) {
      best_v = v;
      best_i = c;
    }
  };
  int64_t scalar_from = 0;
  if (reinterpret_cast<uintptr_t>(xr) % 16 == 0) {
    float4* x4 = reinterpret_cast<float4*>(xr);
    const int64_t n4 = cols / 4;
    for (int64_t j = threadIdx.x; j < n4; j += kThreads) {
      float4 v = x4[j];
      const int64_t c = 4 * j;
      // The four entries' bits (c is a multiple of 4: one word holds them).
      const uint32_t m = (__ldg(bits + (c >> 5)) >> (c & 31)) & 0xFu;
      if (m != 0xFu) {
        if (!(m & 1u)) v.x = -INFINITY;
        if (!(m & 2u)) v.y = -INFINITY;
        if (!(m & 4u)) v.z = -INFINITY;
        if (!(m & 8u)) v.w = -INFINITY;
        x4[j] = v;
      }
      const float vs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (Better(vs[e], c + e, best_v, best_i)) {
          best_v = vs[e];
          best_i = c + e;
        }
      }
    }
    scalar_from = 4 * n4;
  }
  for (int64_t c = scalar_from + threadIdx.x; c < cols; c += kThreads) visit(c);
  for (int m = 16; m > 0; m >>= 1) {
    const float ov = __shfl_xor_sync(kFullMask, best_v, m);
    const int64_t oi = __shfl_xor_sync(kFullMask, best_i, m);
    if (Better(ov, oi, best_v, best_i)) {
      best_v = ov;
      best_i = oi;
    }
  }
  __shared__ float sm_v[kThreads / 32];
  __shared__ int64_t sm_i[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sm_v[warp] = best_v;
    sm_i[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 0; w < kThreads / 32; ++w) {
      if (Better(sm_v[w], sm_i[w], best_v, best_i)) {
        best_v = sm_v[w];
        best_i = sm_i[w];
      }
    }
    // Every value NaN: index 0, as the CPU loop.
    argmax[row] = best_i == INT64_MAX ? 0 : static_cast<int32_t>(best_i);
  }
}

size_t Align256(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

absl::Status LaunchMaskTokens(const TokenMaskParams& p, const Workspace& ws,
                              cudaStream_t stream) {
  const int64_t words = TokenMaskWords(p.cols);
  const size_t per_row = words * sizeof(uint32_t) + sizeof(int32_t);
  const int64_t group =
      static_cast<int64_t>(ws.bytes / per_row) - 1;  // room for alignment
  if (group < 1) {
    return absl::ResourceExhaustedError(
        "token mask: one row's mask exceeds the backend's workspace");
  }
  for (int64_t r0 = 0; r0 < p.rows; r0 += group) {
    const int64_t n = std::min(group, p.rows - r0);
    char* base = static_cast<char*>(ws.data);
    auto* rows = reinterpret_cast<int32_t*>(base);
    auto* bits =
        reinterpret_cast<uint32_t*>(base + Align256(n * sizeof(int32_t)));
    SS_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(rows, p.row_index + r0, n * sizeof(int32_t),
                        cudaMemcpyHostToDevice, stream),
        "token mask rows");
    SS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(bits, p.allowed + r0 * words,
                                            n * words * sizeof(uint32_t),
                                            cudaMemcpyHostToDevice, stream),
                            "token mask words");
    MaskTokensKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
        rows, bits, words, p.x, p.cols, p.x_stride, p.argmax);
    if (absl::Status s = LaunchStatus("token mask launch"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace specserve::kernels::cuda
