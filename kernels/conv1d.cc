#include "kernels/conv1d.h"

#include "kernels/validate.h"

namespace specserve::kernels {

absl::Status Validate(const Conv1dParams& p) {
  SS_KERNEL_CHECK(p.rows >= 1 && p.channels >= 1 && p.kernel >= 2,
                  "conv1d: empty shape or kernel < 2");
  SS_KERNEL_CHECK(p.kernel <= 64, "conv1d: kernel > 64 unsupported");
  SS_KERNEL_CHECK(
      p.x && p.y && p.weight && (p.states || (p.state_in && p.state_out)),
      "conv1d: null pointer");
  SS_KERNEL_CHECK(!p.states || p.state_out_stride == 0,
                  "conv1d: a session batch updates states in place");
  SS_KERNEL_CHECK(p.x_stride >= p.channels && p.y_stride >= p.channels,
                  "conv1d: stride < channels");
  const int64_t state_size = p.channels * (p.kernel - 1);
  SS_KERNEL_CHECK(p.state_out_stride == 0 || p.state_out_stride >= state_size,
                  "conv1d: state_out_stride < state size");
  SS_KERNEL_CHECK(p.state_out_stride == 0 || p.state_in != p.state_out,
                  "conv1d: snapshots must not overwrite state_in");
  return absl::OkStatus();
}

}  // namespace specserve::kernels
