// RMS normalization over the last dimension, in fp32.
//   RmsNorm:      y = x·rsqrt(mean(x²)+eps)·(1+w)   (plus_one; zero-centred w)
//                 y = x·rsqrt(mean(x²)+eps)·w       (!plus_one)
//   GatedRmsNorm: y = w ⊙ (x·rsqrt(mean(x²)+eps)) ⊙ silu(z)  (the GDN output
//                 norm; plain w).
// Rows are independent; strides let the op run over heads inside wider rows
// (e.g. the query half of each head of q_proj's output), in place if y == x.
#ifndef SPECSERVE_KERNELS_RMS_NORM_H_
#define SPECSERVE_KERNELS_RMS_NORM_H_

#include <cstdint>

#include "absl/status/status.h"

namespace specserve::kernels {

struct RmsNormParams {
  int64_t rows = 0;  // vectors to normalize
  int64_t dim = 0;   // length of each
  const float* x = nullptr;
  int64_t x_stride = 0;  // elements between consecutive vectors of x
  float* y = nullptr;    // may equal x
  int64_t y_stride = 0;
  // group > 0: vector r is at x + (r / group)·x_group_stride + (r % group)·
  // x_stride, and likewise in y (heads inside wider token rows, e.g. the
  // query heads of a fused q|k|v output); 0: at x + r·x_stride.
  int64_t group = 0;
  int64_t x_group_stride = 0;
  int64_t y_group_stride = 0;
  const float* weight = nullptr;  // [dim] fp32
  bool plus_one = true;
  float eps = 1e-6f;
};

// Offset of vector r in a (possibly grouped) layout, in elements.
inline int64_t GroupedRow(int64_t r, int64_t stride, int64_t group,
                          int64_t group_stride) {
  return group > 0 ? (r / group) * group_stride + (r % group) * stride
                   : r * stride;
}

struct GatedRmsNormParams {
  int64_t rows = 0;
  int64_t dim = 0;
  const float* x = nullptr;
  int64_t x_stride = 0;
  const float* z = nullptr;  // gate, same layout as x unless grouped:
  int64_t z_stride = 0;
  // z_group > 0: vector r's gate is at z + (r / z_group)·z_group_stride +
  // (r % z_group)·z_stride (heads inside wider token rows, e.g. the z part
  // of a fused in_proj output); 0: at z + r·z_stride.
  int64_t z_group = 0;
  int64_t z_group_stride = 0;
  float* y = nullptr;  // may equal x
  int64_t y_stride = 0;
  const float* weight = nullptr;  // [dim] fp32
  float eps = 1e-6f;
};

absl::Status Validate(const RmsNormParams& p);
absl::Status Validate(const GatedRmsNormParams& p);

}  // namespace specserve::kernels

#endif  // SPECSERVE_KERNELS_RMS_NORM_H_
