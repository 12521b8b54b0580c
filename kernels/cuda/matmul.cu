// Matmul y[T][out] (+)= x[T][in]·W[out][in]ᵀ. bf16 weights with in % 8 == 0
// and aligned rows take the tensor-core path (matmul_mma.cu); every other
// weight takes the CUDA-core kernel below. The choice depends on the weight
// only, so all calls on one weight use one reduction order.
//
// CUDA-core kernel: a weight-streaming kernel for every T.
//
// Fixed reduction order (what makes row t's result independent of T): one
// warp reduces each output element y[t][o]. Lane l accumulates, in
// increasing k, the elements i = k·256 + l·8 + j (j = 0..7) with
// acc = fmaf(x[t][i], w[o][i], acc), starting from +0; elements past `in`
// are skipped. The 32 lane sums are then added by a xor butterfly. Which
// template instance runs (outputs per warp NO, rows per pass NT, loads in
// flight U) and whether the 16-byte or the scalar load path is taken change
// only how many independent (o, t) pairs share the loads, never the
// sequence of operations of one pair.
//
// Work split: a block of kWarps warps owns kWarps·NO consecutive outputs and
// NT consecutive rows (blockIdx.x); every weight tile a lane loads serves all
// NT rows, so a verify over T <= 8 columns reads the weights once. Blocks
// with the same outputs and different row groups are adjacent in launch
// order, so for T > 8 the re-reads of a weight tile hit L2.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/matmul_mma.h"
#include "kernels/cuda/ops.h"

namespace specserve::kernels::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kLaneElems = 8;
constexpr int kChunk = 32 * kLaneElems;  // elements per warp step

template <DType D>
__host__ __device__ constexpr int64_t ElemBytes() {
  return D == DType::kF32 ? 4 : 2;
}

template <DType D, int NO, int NT, int U>
__global__ void __launch_bounds__(kWarps * 32)
    MatmulKernel(MatmulParams p, bool vec) {
  PdlBegin();
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t o0 = (static_cast<int64_t>(blockIdx.y) * kWarps + warp) * NO;
  if (o0 >= p.out) return;  // whole warp
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * NT;
  const int64_t in = p.in;

  // Rows/outputs past the end are clamped to valid memory; their results
  // are computed and dropped.
  const char* wr[NO];
#pragma unroll
  for (int o = 0; o < NO; ++o) {
    const int64_t row = o0 + o < p.out ? o0 + o : p.out - 1;
    wr[o] = static_cast<const char*>(p.w) + row * in * ElemBytes<D>();
  }
  const float* xr[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const int64_t row = t0 + t < p.rows ? t0 + t : p.rows - 1;
    xr[t] = p.x + row * p.x_stride;
  }

  float acc[NO][NT];
#pragma unroll
  for (int o = 0; o < NO; ++o) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[o][t] = 0.0f;
  }

  if (vec) {
    // in % 8 == 0 here, so a lane's chunk at k < in is complete.
    for (int64_t base = 0; base < in; base += U * kChunk) {
      Raw8<D> raw[U][NO];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t k = base + u * kChunk + lane * kLaneElems;
        if (k < in) {
#pragma unroll
          for (int o = 0; o < NO; ++o) raw[u][o] = LoadRaw8<D>(wr[o], k);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t k = base + u * kChunk + lane * kLaneElems;
        if (k < in) {
          float xv[NT][8];
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            const float4 a = __ldg(reinterpret_cast<const float4*>(xr[t] + k));
            const float4 b =
                __ldg(reinterpret_cast<const float4*>(xr[t] + k + 4));
            xv[t][0] = a.x;
            xv[t][1] = a.y;
            xv[t][2] = a.z;
            xv[t][3] = a.w;
            xv[t][4] = b.x;
            xv[t][5] = b.y;
            xv[t][6] = b.z;
            xv[t][7] = b.w;
          }
#pragma unroll
          for (int o = 0; o < NO; ++o) {
            float wv[8];
            Widen8<D>(raw[u][o], wv);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
#pragma unroll
              for (int t = 0; t < NT; ++t) {
                acc[o][t] = fmaf(xv[t][j], wv[j], acc[o][t]);
              }
            }
          }
        }
      }
    }
  } else {
    // Scalar loads, same per-pair operation sequence.
    for (int64_t k = lane * kLaneElems; k < in; k += kChunk) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int64_t i = k + j;
        if (i < in) {
          float xv[NT];
#pragma unroll
          for (int t = 0; t < NT; ++t) xv[t] = __ldg(xr[t] + i);
#pragma unroll
          for (int o = 0; o < NO; ++o) {
            const float w = LoadElem<D>(wr[o], i);
#pragma unroll
            for (int t = 0; t < NT; ++t) acc[o][t] = fmaf(xv[t], w, acc[o][t]);
          }
        }
      }
    }
  }

#pragma unroll
  for (int o = 0; o < NO; ++o) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float r = WarpSum(acc[o][t]);
      if (lane == (o * NT + t) % 32 && o0 + o < p.out && t0 + t < p.rows) {
        float* y = p.y + (t0 + t) * p.y_stride + (o0 + o);
        *y = p.accumulate ? __fadd_rn(*y, r) : r;
      }
    }
  }
}

template <DType D, int NO, int NT, int U>
absl::Status Run(const MatmulParams& p, bool vec, cudaStream_t stream) {
  const int64_t gx = CeilDiv(p.rows, NT);
  const int64_t gy = CeilDiv(p.out, static_cast<int64_t>(kWarps) * NO);
  if (gy > 65535 || gx > 0x7fffffff) {
    return absl::InvalidArgumentError("matmul: shape too large for the grid");
  }
  LaunchPdl(MatmulKernel<D, NO, NT, U>,
            dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)),
            kWarps * 32, 0, stream, p, vec);
  return LaunchStatus("matmul launch");
}

template <DType D>
absl::Status RunTyped(const MatmulParams& p, cudaStream_t stream) {
  // 16-byte loads need 16-byte aligned weight rows and x rows.
  const bool vec = p.in % kLaneElems == 0 &&
                   reinterpret_cast<uintptr_t>(p.w) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(p.x) % 16 == 0 &&
                   (p.rows == 1 || p.x_stride % 4 == 0);
  if (p.rows == 1) return Run<D, 2, 1, 4>(p, vec, stream);
  if (p.rows == 2) return Run<D, 2, 2, 4>(p, vec, stream);
  if (p.rows <= 4) return Run<D, 4, 4, 2>(p, vec, stream);
  return Run<D, 4, 8, (D == DType::kF32 ? 2 : 4)>(p, vec, stream);
}

}  // namespace

absl::Status LaunchMatmul(const MatmulParams& p, const MatmulResources& r,
                          cudaStream_t stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  const bool mma = r.x_splits != 0 && MmaMatmulApplies(p);
  if (!mma && p.w_layout != WeightLayout::kRowMajor) {
    return absl::InvalidArgumentError(
        absl::StrCat("matmul: a weight in ", WeightLayoutName(p.w_layout),
                     " needs the tensor-core path (bf16, in % 8 == 0, 16-byte "
                     "aligned, x splits 2 or 3)"));
  }
  // A fused prologue the chosen kernel cannot fuse (the norm beyond
  // kMaxFusedNormRows rows, or either off the tensor-core path) runs as its
  // own op into scratch, then the plain matmul: the same bits either way.
  const bool unfused_norm =
      p.norm_weight != nullptr && !(mma && p.rows <= kMaxFusedNormRows);
  const bool unfused_swiglu = p.swiglu && !mma;
  if (unfused_norm || unfused_swiglu) {
    const size_t need = static_cast<size_t>(p.rows * p.in) * sizeof(float);
    if (r.norm_scratch.bytes < need) {
      return absl::InternalError("matmul: prologue scratch too small");
    }
    float* x = static_cast<float*>(r.norm_scratch.data);
    absl::Status s = unfused_norm ? LaunchRmsNorm(FusedNormOf(p, x), stream)
                                  : LaunchSwiglu(FusedSwigluOf(p, x), stream);
    if (!s.ok()) return s;
    MatmulParams plain = p;
    plain.x = x;
    plain.x_stride = p.in;
    plain.norm_weight = nullptr;
    plain.swiglu = false;
    return LaunchMatmul(plain, r, stream);
  }
  if (mma) {
    return LaunchMmaMatmul(p, r.x_splits, r.ws, r.x_frags, r.counters, stream);
  }
  switch (p.w_dtype) {
    case DType::kF32:
      return RunTyped<DType::kF32>(p, stream);
    case DType::kBF16:
      return RunTyped<DType::kBF16>(p, stream);
    case DType::kF16:
      return RunTyped<DType::kF16>(p, stream);
  }
  return absl::InvalidArgumentError("matmul: unknown weight dtype");
}

}  // namespace specserve::kernels::cuda
