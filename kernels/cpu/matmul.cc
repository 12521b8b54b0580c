#include "kernels/cpu/matmul.h"

#include <algorithm>

#include "glog/logging.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/simd.h"

namespace specserve::kernels::cpu {
namespace {

// Outputs per micro-block: the weight rows one pass over x[t] serves.
constexpr int kBlock = 4;
// Below this many multiply-adds an op runs on the calling thread only.
constexpr int64_t kParallelWork = 1 << 17;

template <DType D>
inline float ScalarW(const void* w, int64_t i) {
  if constexpr (D == DType::kF32) {
    return static_cast<const float*>(w)[i];
  } else if constexpr (D == DType::kBF16) {
    return Bf16ToFloat(static_cast<const uint16_t*>(w)[i]);
  } else {
    return F16ToFloat(static_cast<const uint16_t*>(w)[i]);
  }
}

// NO dot products x·w_o (o < NO), each in the fixed order described in
// matmul.h; the arithmetic of output o does not depend on NO.
template <DType D, int NO>
SS_AVX2 void DotAvx2(const float* x, const void* const* w, int64_t in,
                     float* out) {
  __m256 a0[NO], a1[NO];
  for (int o = 0; o < NO; ++o) a0[o] = a1[o] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= in; i += 16) {
    const __m256 x0 = _mm256_loadu_ps(x + i);
    const __m256 x1 = _mm256_loadu_ps(x + i + 8);
    for (int o = 0; o < NO; ++o) {
      a0[o] = _mm256_fmadd_ps(x0, LoadW8<D>(w[o], i), a0[o]);
      a1[o] = _mm256_fmadd_ps(x1, LoadW8<D>(w[o], i + 8), a1[o]);
    }
  }
  if (i + 8 <= in) {
    const __m256 x0 = _mm256_loadu_ps(x + i);
    for (int o = 0; o < NO; ++o) {
      a0[o] = _mm256_fmadd_ps(x0, LoadW8<D>(w[o], i), a0[o]);
    }
    i += 8;
  }
  float tail[NO];
  for (int o = 0; o < NO; ++o) tail[o] = 0.0f;
  for (; i < in; ++i) {
    for (int o = 0; o < NO; ++o) tail[o] += x[i] * ScalarW<D>(w[o], i);
  }
  for (int o = 0; o < NO; ++o) {
    out[o] = HorizontalSum(_mm256_add_ps(a0[o], a1[o])) + tail[o];
  }
}

// Portable path: 8 partial sums (element i mod 8), then a fixed tree.
template <DType D, int NO>
void DotScalar(const float* x, const void* const* w, int64_t in, float* out) {
  for (int o = 0; o < NO; ++o) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= in; i += 8) {
      for (int l = 0; l < 8; ++l) acc[l] += x[i + l] * ScalarW<D>(w[o], i + l);
    }
    float tail = 0.0f;
    for (; i < in; ++i) tail += x[i] * ScalarW<D>(w[o], i);
    out[o] = ((acc[0] + acc[4]) + (acc[2] + acc[6])) +
             ((acc[1] + acc[5]) + (acc[3] + acc[7])) + tail;
  }
}

template <DType D, int NO>
inline void Dot(bool avx2, const float* x, const void* const* w, int64_t in,
                float* out) {
  if (avx2) {
    DotAvx2<D, NO>(x, w, in, out);
  } else {
    DotScalar<D, NO>(x, w, in, out);
  }
}

// Outputs [o_begin, o_end) for every row: each block of weight rows is
// reused across the T rows while it is in L1. (bf16 blocks are not widened to
// fp32 once per block: that doubles the L1 footprint and runs slower.)
template <DType D>
void MatmulRange(const MatmulParams& p, int64_t o_begin, int64_t o_end,
                 bool avx2) {
  const size_t row_bytes = static_cast<size_t>(p.in) * DTypeSize(D);
  const char* wbase = static_cast<const char*>(p.w);
  float r[kBlock];
  int64_t o = o_begin;
  for (; o + kBlock <= o_end; o += kBlock) {
    const void* w[kBlock];
    for (int j = 0; j < kBlock; ++j) w[j] = wbase + (o + j) * row_bytes;
    for (int64_t t = 0; t < p.rows; ++t) {
      Dot<D, kBlock>(avx2, p.x + t * p.x_stride, w, p.in, r);
      float* y = p.y + t * p.y_stride + o;
      for (int j = 0; j < kBlock; ++j) y[j] = p.accumulate ? y[j] + r[j] : r[j];
    }
  }
  for (; o < o_end; ++o) {
    const void* w[1] = {wbase + o * row_bytes};
    for (int64_t t = 0; t < p.rows; ++t) {
      Dot<D, 1>(avx2, p.x + t * p.x_stride, w, p.in, r);
      float* y = p.y + t * p.y_stride + o;
      *y = p.accumulate ? *y + r[0] : r[0];
    }
  }
}

template <DType D>
void MatmulTyped(const MatmulParams& p, ThreadPool* pool) {
  const bool avx2 = HasAvx2();
  const int64_t work = p.rows * p.in * p.out;
  const int threads = pool ? pool->num_threads() : 1;
  if (threads == 1 || work < kParallelWork || p.out < 2 * kBlock) {
    MatmulRange<D>(p, 0, p.out, avx2);
    return;
  }
  // Chunks of whole blocks; a few per thread to even out the tail.
  const int64_t blocks = (p.out + kBlock - 1) / kBlock;
  const int64_t tasks = std::min<int64_t>(blocks, threads * 4);
  const int64_t blocks_per_task = (blocks + tasks - 1) / tasks;
  const int64_t chunk = blocks_per_task * kBlock;
  const int64_t n = (p.out + chunk - 1) / chunk;
  pool->ParallelFor(n, [&](int64_t i) {
    const int64_t begin = i * chunk;
    const int64_t end = std::min(p.out, begin + chunk);
    MatmulRange<D>(p, begin, end, avx2);
  });
}

}  // namespace

bool MatmulUsesAvx2() { return HasAvx2(); }

void Matmul(const MatmulParams& p, ThreadPool* pool) {
  switch (p.w_dtype) {
    case DType::kF32:
      return MatmulTyped<DType::kF32>(p, pool);
    case DType::kBF16:
      return MatmulTyped<DType::kBF16>(p, pool);
    case DType::kF16:
      return MatmulTyped<DType::kF16>(p, pool);
  }
  LOG(FATAL) << "matmul: unknown weight dtype";
}

}  // namespace specserve::kernels::cpu
