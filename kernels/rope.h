// Partial rotary position embedding, rotate-half convention, in place:
// for each head vector x (length head_dim) of row t at position
// first_position + t, the first rotary_dim entries become
//   x'[i]       = x[i]·cos(θ_i) − x[i+r/2]·sin(θ_i)
//   x'[i+r/2]   = x[i+r/2]·cos(θ_i) + x[i]·sin(θ_i),  i < r/2, r = rotary_dim,
// θ_i = position·inv_freq[i]; the remaining entries pass through.
// Angles are formed in fp32 (as transformers does). Rows are independent.
// With positions != nullptr (backend memory, [rows]) row t is at position
// positions[t] instead (a batch of sessions, one row each).
#ifndef SPECSERVE_KERNELS_ROPE_H_
#define SPECSERVE_KERNELS_ROPE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace specserve::kernels {

struct RopeParams {
  int64_t rows = 0;   // T; row t has position first_position + t
  int64_t heads = 0;  // head vectors per row
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;  // even, <= head_dim
  float* x = nullptr;
  int64_t row_stride = 0;   // elements between rows
  int64_t head_stride = 0;  // elements between heads of a row
  int64_t first_position = 0;
  const float* inv_freq = nullptr;     // [rotary_dim/2] fp32, backend memory
  const int32_t* positions = nullptr;  // optional [rows], backend memory
};

// inv_freq_i = θ^(−2i/r) computed as transformers does (fp32 pow).
std::vector<float> RopeInvFreq(double theta, int64_t rotary_dim);

absl::Status Validate(const RopeParams& p);

}  // namespace specserve::kernels

#endif  // SPECSERVE_KERNELS_ROPE_H_
