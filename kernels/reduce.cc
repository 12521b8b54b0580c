#include "kernels/reduce.h"

#include "kernels/validate.h"

namespace specserve::kernels {

absl::Status Validate(const ArgmaxParams& p) {
  SS_KERNEL_CHECK(p.rows >= 1 && p.cols >= 1, "argmax: empty shape");
  SS_KERNEL_CHECK(p.x && p.out, "argmax: null pointer");
  SS_KERNEL_CHECK(p.x_stride >= p.cols, "argmax: stride < cols");
  return absl::OkStatus();
}

absl::Status Validate(const LogSumExpParams& p) {
  SS_KERNEL_CHECK(p.rows >= 1 && p.cols >= 1, "logsumexp: empty shape");
  SS_KERNEL_CHECK(p.x && p.out, "logsumexp: null pointer");
  SS_KERNEL_CHECK(p.x_stride >= p.cols, "logsumexp: stride < cols");
  return absl::OkStatus();
}

absl::Status Validate(const SoftmaxParams& p) {
  SS_KERNEL_CHECK(p.rows >= 1 && p.cols >= 1, "softmax: empty shape");
  SS_KERNEL_CHECK(p.x && p.y, "softmax: null pointer");
  SS_KERNEL_CHECK(p.x_stride >= p.cols && p.y_stride >= p.cols,
                  "softmax: stride < cols");
  return absl::OkStatus();
}

}  // namespace specserve::kernels
