#include "kernels/rope.h"

#include <cmath>

#include "kernels/validate.h"

namespace specserve::kernels {

std::vector<float> RopeInvFreq(double theta, int64_t rotary_dim) {
  std::vector<float> inv_freq(rotary_dim / 2);
  for (int64_t i = 0; i < rotary_dim / 2; ++i) {
    // torch: 1.0 / (base ** (arange(0, dim, 2, float32) / dim)), in fp32.
    const float exponent =
        static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    const float p = std::pow(static_cast<float>(theta), exponent);
    inv_freq[i] = 1.0f / p;
  }
  return inv_freq;
}

absl::Status Validate(const RopeParams& p) {
  SS_KERNEL_CHECK(p.rows >= 1 && p.heads >= 1 && p.head_dim >= 1,
                  "rope: empty shape");
  SS_KERNEL_CHECK(p.rotary_dim % 2 == 0 && p.rotary_dim <= p.head_dim,
                  "rope: rotary_dim must be even and <= head_dim");
  SS_KERNEL_CHECK(p.x && (p.inv_freq || p.rotary_dim == 0),
                  "rope: null pointer");
  SS_KERNEL_CHECK(p.head_stride >= p.head_dim, "rope: head_stride < head_dim");
  SS_KERNEL_CHECK(
      p.rows == 1 || p.row_stride >= (p.heads - 1) * p.head_stride + p.head_dim,
      "rope: row_stride too small");
  SS_KERNEL_CHECK(p.first_position >= 0, "rope: negative position");
  return absl::OkStatus();
}

}  // namespace specserve::kernels
