#include "kernels/swiglu.h"

#include "kernels/validate.h"

namespace specserve::kernels {

absl::Status Validate(const SwigluParams& p) {
  SS_KERNEL_CHECK(p.rows >= 1 && p.dim >= 1, "swiglu: empty shape");
  SS_KERNEL_CHECK(p.gate && p.up && p.out, "swiglu: null pointer");
  SS_KERNEL_CHECK(
      p.gate_stride >= p.dim && p.up_stride >= p.dim && p.out_stride >= p.dim,
      "swiglu: stride < dim");
  return absl::OkStatus();
}

}  // namespace specserve::kernels
