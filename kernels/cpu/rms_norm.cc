#include "kernels/cpu/rms_norm.h"

#include <cmath>

#include "kernels/cpu/elementwise.h"

namespace specserve::kernels::cpu {
namespace {

float InvRms(const float* x, int64_t dim, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float mean = static_cast<float>(ss / static_cast<double>(dim));
  return 1.0f / std::sqrt(mean + eps);
}

}  // namespace

void RmsNorm(const RmsNormParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + GroupedRow(r, p.x_stride, p.group, p.x_group_stride);
    float* y = p.y + GroupedRow(r, p.y_stride, p.group, p.y_group_stride);
    const float inv = InvRms(x, p.dim, p.eps);
    if (p.plus_one) {
      for (int64_t i = 0; i < p.dim; ++i)
        y[i] = (x[i] * inv) * (1.0f + p.weight[i]);
    } else {
      for (int64_t i = 0; i < p.dim; ++i) y[i] = (x[i] * inv) * p.weight[i];
    }
  }
}

void GatedRmsNorm(const GatedRmsNormParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * p.x_stride;
    const float* z = p.z + (p.z_group > 0 ? (r / p.z_group) * p.z_group_stride +
                                                (r % p.z_group) * p.z_stride
                                          : r * p.z_stride);
    float* y = p.y + r * p.y_stride;
    const float inv = InvRms(x, p.dim, p.eps);
    for (int64_t i = 0; i < p.dim; ++i) {
      y[i] = (p.weight[i] * (x[i] * inv)) * Silu(z[i]);
    }
  }
}

}  // namespace specserve::kernels::cpu
