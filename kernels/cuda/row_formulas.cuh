// Per-element formulas that an op's own kernel and a fused kernel standing
// for it must share, so that the fused kernel gives the op's bits by
// construction (attention_inputs.cu stands for Rope and ScatterRows,
// gated_delta_rule.cu's fused conv and norm for Conv1d and GatedRmsNorm).
#ifndef SPECSERVE_KERNELS_CUDA_ROW_FORMULAS_CUH_
#define SPECSERVE_KERNELS_CUDA_ROW_FORMULAS_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/scatter_rows.h"

namespace specserve::kernels::cuda {

// Row t's position as RoPE reads it (kernels/rope.h), in fp32.
__device__ __forceinline__ float RopePosition(const RopeParams& p, int64_t t) {
  return static_cast<float>(p.positions != nullptr ? p.positions[t]
                                                   : p.first_position + t);
}

// The rotation of the pair (x1, x2) = (x[i], x[i + rotary_dim/2]): the angle
// pos·inv_freq[i] in fp32, CUDA's accurate cosf/sinf, no contraction.
__device__ __forceinline__ void RopeRotate(float x1, float x2, float pos,
                                           float inv_freq, float* y1,
                                           float* y2) {
  const float angle = __fmul_rn(pos, inv_freq);
  const float c = cosf(angle);
  const float s = sinf(angle);
  *y1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
  *y2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

// One channel's conv at one token (kernels/conv1d.h) before its silu: Σ_j
// w[j]·win[j] over the first k of N slots, from +0 in j order, each product
// and sum rounded (the CPU's order).
template <int N>
__device__ __forceinline__ float ConvWindowSum(const float (&w)[N],
                                               const float (&win)[N], int k) {
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    if (j < k) acc = __fadd_rn(acc, __fmul_rn(w[j], win[j]));
  }
  return acc;
}

// Vector r's gate row of a gated norm (kernels/rms_norm.h: z_group).
__device__ __forceinline__ const float* GateRow(const GatedRmsNormParams& p,
                                                int64_t r) {
  return p.z + (p.z_group > 0 ? (r / p.z_group) * p.z_group_stride +
                                    (r % p.z_group) * p.z_stride
                              : r * p.z_stride);
}

// A destination row of a scatter (kernels/scatter_rows.h): element i
// stores x as fp32, or rounded to bf16 (nearest even) in a bf16 cache.
struct ScatterRow {
  void* row;
  bool bf16;

  // The row from element `offset` on.
  __device__ __forceinline__ ScatterRow At(int64_t offset) const {
    return {static_cast<char*>(row) + offset * (bf16 ? 2 : 4), bf16};
  }
  __device__ __forceinline__ void Store(int64_t i, float x) const {
    if (bf16) {
      static_cast<__nv_bfloat16*>(row)[i] = __float2bfloat16_rn(x);
    } else {
      static_cast<float*>(row)[i] = x;
    }
  }
};

// Row t's destination of a scatter.
__device__ __forceinline__ ScatterRow ScatterRowDst(const ScatterRowsParams& p,
                                                    int64_t t) {
  const bool bf16 = p.dst_dtype == DType::kBF16;
  const int64_t row =
      p.dst != nullptr ? int64_t{p.dst_rows[t]} : p.dst_first_row + t;
  void* base = p.dst != nullptr ? p.dst[t] : p.dst_base;
  return ScatterRow{base, bf16}.At(row * p.dst_row_stride);
}

}  // namespace specserve::kernels::cuda

#endif  // SPECSERVE_KERNELS_CUDA_ROW_FORMULAS_CUH_
