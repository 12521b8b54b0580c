// Matmul: y[T][out] (+)= x[T][in] · W[out][in]ᵀ, fp32 activations, weights in
// their storage dtype, fp32 accumulation.
//
// Determinism contract (what makes verify == decode bit-for-bit): every
// output element y[t][o] is produced by the same instruction sequence for any
// `rows`, any row index t and any thread count: its reduction order over `in`
// depends only on `in`.
#ifndef SPECSERVE_KERNELS_MATMUL_H_
#define SPECSERVE_KERNELS_MATMUL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/rms_norm.h"
#include "kernels/swiglu.h"
#include "kernels/types.h"

namespace specserve::kernels {

struct MatmulParams {
  int64_t rows = 0;  // T (>= 1)
  int64_t in = 0;    // reduction length (== w.cols)
  int64_t out = 0;   // outputs (<= w.rows; the first `out` rows of W)
  const float* x = nullptr;
  int64_t x_stride = 0;  // elements between rows of x (>= in)
  DType w_dtype = DType::kF32;
  WeightLayout w_layout =
      WeightLayout::kRowMajor;  // the Weight's (kernels/types.h)
  const void* w = nullptr;      // [>= out][in] in w_layout
  float* y = nullptr;
  int64_t y_stride = 0;  // elements between rows of y (>= out)
  // true: y += x·Wᵀ (the residual add, fused); false: y = x·Wᵀ.
  bool accumulate = false;
  // Optional RMSNorm of each x row fused in front (a block's input norm):
  // with norm_weight set, x is read as RmsNorm(x) with these fields
  // (kernels/rms_norm.h: plus_one, eps; dim = in), and the result equals an
  // RmsNorm into a buffer followed by this matmul, bit for bit.
  const float* norm_weight = nullptr;  // [in]
  bool norm_plus_one = true;
  float norm_eps = 1e-6f;
  // Optional SwiGLU fused in front (the MLP's down projection): x row t is
  // read as silu(g)⊙u with g = x[t][0, in) and u = x[t][in, 2·in)
  // (x_stride >= 2·in), and the result equals a Swiglu op into a buffer
  // followed by this matmul, bit for bit. Not together with norm_weight.
  bool swiglu = false;
};

// Fills the params for y = x·Wᵀ with dense strides.
MatmulParams DenseMatmul(int64_t rows, const float* x, const Weight& w,
                         float* y, bool accumulate = false);

// The RmsNorm a fused-norm matmul applies to x, as its own op's params
// (x rows normalised into `y`, dense).
RmsNormParams FusedNormOf(const MatmulParams& p, float* y);

// The Swiglu a fused-SwiGLU matmul applies to x, as its own op's params
// (rows written into `out`, dense).
SwigluParams FusedSwigluOf(const MatmulParams& p, float* out);

absl::Status Validate(const MatmulParams& p);

}  // namespace specserve::kernels

#endif  // SPECSERVE_KERNELS_MATMUL_H_
