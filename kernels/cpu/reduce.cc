#include "kernels/cpu/reduce.h"

#include <cmath>

namespace specserve::kernels::cpu {
namespace {

float RowMax(const float* x, int64_t n, float scale) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i] * scale;
    if (v > m) m = v;
  }
  return m;
}

}  // namespace

void Argmax(const ArgmaxParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * p.x_stride;
    int64_t best = 0;
    for (int64_t i = 1; i < p.cols; ++i) {
      if (x[i] > x[best]) best = i;
    }
    p.out[r] = static_cast<int32_t>(best);
    if (p.finite != nullptr) {
      bool all = true;
      for (int64_t i = 0; i < p.cols; ++i) all = all && std::isfinite(x[i]);
      p.finite[r] = all ? 1 : 0;
    }
  }
}

void LogSumExp(const LogSumExpParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * p.x_stride;
    const float m = RowMax(x, p.cols, p.inv_temperature);
    double sum = 0.0;
    for (int64_t i = 0; i < p.cols; ++i) {
      sum += std::exp(static_cast<double>(x[i] * p.inv_temperature - m));
    }
    p.out[r] = m + static_cast<float>(std::log(sum));
  }
}

void Softmax(const SoftmaxParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * p.x_stride;
    float* y = p.y + r * p.y_stride;
    const float m = RowMax(x, p.cols, p.inv_temperature);
    double sum = 0.0;
    for (int64_t i = 0; i < p.cols; ++i) {
      const float e = std::exp(x[i] * p.inv_temperature - m);
      y[i] = e;
      sum += e;
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < p.cols; ++i) y[i] *= inv;
  }
}

}  // namespace specserve::kernels::cpu
