// Elements of the delta rule's recurrent state in memory
// (GatedDeltaRuleParams state_dtype): fp32, or bf16 rounded to nearest even
// (__float2bfloat16_rn: the CPU's FloatToBf16 bits, NaN to 0x7fff). The
// kernels run the rule in fp32 and pass each token's state through
// RoundState before the next token, so the state between two tokens is a
// value of the storage type whether it is stored or stays in registers.
#ifndef SPECSERVE_KERNELS_CUDA_STATE_ELEM_CUH_
#define SPECSERVE_KERNELS_CUDA_STATE_ELEM_CUH_

#include <cuda_bf16.h>

#include <type_traits>

namespace specserve::kernels::cuda {

__device__ __forceinline__ float LoadState(const float* x) { return *x; }
__device__ __forceinline__ float LoadState(const __nv_bfloat16* x) {
  return __bfloat162float(*x);
}
__device__ __forceinline__ void StoreState(float* x, float v) { *x = v; }
__device__ __forceinline__ void StoreState(__nv_bfloat16* x, float v) {
  *x = __float2bfloat16_rn(v);
}

// v as the storage type holds it, widened back (fp32: v itself).
template <typename T>
__device__ __forceinline__ float RoundState(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return __bfloat162float(__float2bfloat16_rn(v));
  }
}

// Two adjacent elements (8-byte fp32 or 4-byte bf16 accesses; the caller
// checks the alignment).
__device__ __forceinline__ float2 LoadState2(const float* x) {
  return *reinterpret_cast<const float2*>(x);
}
__device__ __forceinline__ float2 LoadState2(const __nv_bfloat16* x) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(x));
}
__device__ __forceinline__ void StoreState2(float* x, float a, float b) {
  *reinterpret_cast<float2*>(x) = make_float2(a, b);
}
__device__ __forceinline__ void StoreState2(__nv_bfloat16* x, float a,
                                            float b) {
  *reinterpret_cast<__nv_bfloat162*>(x) =
      __halves2bfloat162(__float2bfloat16_rn(a), __float2bfloat16_rn(b));
}

}  // namespace specserve::kernels::cuda

#endif  // SPECSERVE_KERNELS_CUDA_STATE_ELEM_CUH_
