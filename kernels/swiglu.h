// SwiGLU activation of the MLP: out = silu(gate) ⊙ up, elementwise per row
// (the two projections are plain matmuls before it, down_proj after it).
#ifndef SPECSERVE_KERNELS_SWIGLU_H_
#define SPECSERVE_KERNELS_SWIGLU_H_

#include <cstdint>

#include "absl/status/status.h"

namespace specserve::kernels {

struct SwigluParams {
  int64_t rows = 0;
  int64_t dim = 0;
  const float* gate = nullptr;
  int64_t gate_stride = 0;
  const float* up = nullptr;
  int64_t up_stride = 0;
  float* out = nullptr;  // may equal gate or up (same stride)
  int64_t out_stride = 0;
};

absl::Status Validate(const SwigluParams& p);

}  // namespace specserve::kernels

#endif  // SPECSERVE_KERNELS_SWIGLU_H_
