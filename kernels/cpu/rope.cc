#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

namespace specserve::kernels::cpu {

void Rope(const RopeParams& p) {
  const int64_t half = p.rotary_dim / 2;
  std::vector<float> cos_t(half), sin_t(half);
  for (int64_t t = 0; t < p.rows; ++t) {
    const float pos = static_cast<float>(p.first_position + t);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * p.inv_freq[i];  // fp32, as transformers
      cos_t[i] = std::cos(angle);
      sin_t[i] = std::sin(angle);
    }
    for (int64_t h = 0; h < p.heads; ++h) {
      float* x = p.x + t * p.row_stride + h * p.head_stride;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = x[i];
        const float x2 = x[i + half];
        x[i] = x1 * cos_t[i] - x2 * sin_t[i];
        x[i + half] = x2 * cos_t[i] + x1 * sin_t[i];
      }
    }
  }
}

}  // namespace specserve::kernels::cpu
