// Helpers for the CPU backend's AVX2 paths. Functions marked SS_AVX2 are
// compiled for AVX2+FMA+F16C whatever the build flags and must only run when
// HasAvx2() is true; each op keeps a portable path for other machines. The
// CPU ops are compiled with -ffp-contract=off so that every fused multiply-add
// is an explicit intrinsic: the compiler never decides per call site.
#ifndef SPECSERVE_KERNELS_CPU_SIMD_H_
#define SPECSERVE_KERNELS_CPU_SIMD_H_

#include <immintrin.h>

#include <cstdint>

#include "kernels/types.h"

#define SS_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace specserve::kernels::cpu {

// True when this CPU has AVX2, FMA and F16C (checked once).
bool HasAvx2();

// Loads 8 weight elements of dtype D starting at element i, widened to fp32.
template <DType D>
SS_AVX2 inline __m256 LoadW8(const void* base, int64_t i) {
  if constexpr (D == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + i);
  } else if constexpr (D == DType::kBF16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(
        static_cast<const uint16_t*>(base) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(
        static_cast<const uint16_t*>(base) + i));
    return _mm256_cvtph_ps(h);
  }
}

// Sum of the 8 lanes in a fixed order: (l0+l4, l1+l5, l2+l6, l3+l7), then
// pairs, then the last two.
SS_AVX2 inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

}  // namespace specserve::kernels::cpu

#endif  // SPECSERVE_KERNELS_CPU_SIMD_H_
