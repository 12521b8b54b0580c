#include "kernels/cpu/conv1d.h"

#include "kernels/cpu/elementwise.h"

namespace specserve::kernels::cpu {

void Conv1d(const Conv1dParams& p) {
  const int64_t k = p.kernel;
  const int64_t s = k - 1;  // state length per channel
  constexpr int64_t kMaxKernel = 64;
  float window[kMaxKernel];
  for (int64_t t = 0; t < p.rows; ++t) {
    const float* src =
        t == 0 ? p.state_in : p.state_out + (t - 1) * p.state_out_stride;
    float* dst = p.state_out + t * p.state_out_stride;
    const float* x = p.x + t * p.x_stride;
    float* y = p.y + t * p.y_stride;
    for (int64_t c = 0; c < p.channels; ++c) {
      const float* st = src + c * s;
      for (int64_t j = 0; j < s; ++j) window[j] = st[j];
      window[s] = x[c];
      const float* w = p.weight + c * k;
      float acc = 0.0f;
      for (int64_t j = 0; j < k; ++j) acc += w[j] * window[j];
      y[c] = p.silu ? Silu(acc) : acc;
      float* dt = dst + c * s;
      for (int64_t j = 0; j < s; ++j) dt[j] = window[j + 1];
    }
  }
}

}  // namespace specserve::kernels::cpu
