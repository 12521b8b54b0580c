// Row reductions over logits: argmax (first index of the maximum, like
// torch.argmax), log-sum-exp, and softmax with a temperature. Rows are
// independent; each row's result does not depend on how many rows there are.
#ifndef SPECSERVE_KERNELS_REDUCE_H_
#define SPECSERVE_KERNELS_REDUCE_H_

#include <cstdint>

#include "absl/status/status.h"

namespace specserve::kernels {

struct ArgmaxParams {
  int64_t rows = 0;
  int64_t cols = 0;
  const float* x = nullptr;
  int64_t x_stride = 0;
  int32_t* out = nullptr;  // [rows]
  // Optional [rows]: 1 when every x of the row is finite, else 0 (NaN or
  // ±inf), so a caller can check a row without copying it.
  int32_t* finite = nullptr;
};

struct LogSumExpParams {
  int64_t rows = 0;
  int64_t cols = 0;
  const float* x = nullptr;
  int64_t x_stride = 0;
  float* out = nullptr;  // [rows]: log Σ exp(x·inv_temperature)
  float inv_temperature = 1.0f;
};

struct SoftmaxParams {
  int64_t rows = 0;
  int64_t cols = 0;
  const float* x = nullptr;
  int64_t x_stride = 0;
  float* y = nullptr;  // may equal x (same stride)
  int64_t y_stride = 0;
  float inv_temperature = 1.0f;  // y = softmax(x·inv_temperature)
};

absl::Status Validate(const ArgmaxParams& p);
absl::Status Validate(const LogSumExpParams& p);
absl::Status Validate(const SoftmaxParams& p);

}  // namespace specserve::kernels

#endif  // SPECSERVE_KERNELS_REDUCE_H_
