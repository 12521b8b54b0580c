#include "kernels/matmul.h"

#include "kernels/validate.h"

namespace specserve::kernels {

MatmulParams DenseMatmul(int64_t rows, const float* x, const Weight& w,
                         float* y, bool accumulate) {
  MatmulParams p;
  p.rows = rows;
  p.in = w.cols;
  p.out = w.rows;
  p.x = x;
  p.x_stride = w.cols;
  p.w_dtype = w.dtype;
  p.w_layout = w.layout;
  p.w = w.data;
  p.y = y;
  p.y_stride = w.rows;
  p.accumulate = accumulate;
  return p;
}

RmsNormParams FusedNormOf(const MatmulParams& p, float* y) {
  RmsNormParams n;
  n.rows = p.rows;
  n.dim = p.in;
  n.x = p.x;
  n.x_stride = p.x_stride;
  n.y = y;
  n.y_stride = p.in;
  n.weight = p.norm_weight;
  n.plus_one = p.norm_plus_one;
  n.eps = p.norm_eps;
  return n;
}

SwigluParams FusedSwigluOf(const MatmulParams& p, float* out) {
  SwigluParams s;
  s.rows = p.rows;
  s.dim = p.in;
  s.gate = p.x;
  s.gate_stride = p.x_stride;
  s.up = p.x + p.in;
  s.up_stride = p.x_stride;
  s.out = out;
  s.out_stride = p.in;
  return s;
}

absl::Status Validate(const MatmulParams& p) {
  SS_KERNEL_CHECK(p.rows >= 1 && p.in >= 1 && p.out >= 1,
                  "matmul: empty shape");
  SS_KERNEL_CHECK(p.x && p.w && p.y, "matmul: null pointer");
  SS_KERNEL_CHECK(p.x_stride >= p.in, "matmul: x_stride < in");
  SS_KERNEL_CHECK(!p.swiglu || p.x_stride >= 2 * p.in,
                  "matmul: a fused swiglu needs x_stride >= 2·in");
  SS_KERNEL_CHECK(!p.swiglu || p.norm_weight == nullptr,
                  "matmul: a fused swiglu and a fused norm together");
  SS_KERNEL_CHECK(p.y_stride >= p.out, "matmul: y_stride < out");
  return absl::OkStatus();
}

}  // namespace specserve::kernels
