#include "kernels/rms_norm.h"

#include "kernels/validate.h"

namespace specserve::kernels {

absl::Status Validate(const RmsNormParams& p) {
  SS_KERNEL_CHECK(p.rows >= 1 && p.dim >= 1, "rms_norm: empty shape");
  SS_KERNEL_CHECK(p.x && p.y && p.weight, "rms_norm: null pointer");
  SS_KERNEL_CHECK(p.x_stride >= p.dim && p.y_stride >= p.dim,
                  "rms_norm: stride < dim");
  SS_KERNEL_CHECK(p.x != p.y || (p.x_stride == p.y_stride &&
                                 p.x_group_stride == p.y_group_stride),
                  "rms_norm: in place needs equal strides");
  SS_KERNEL_CHECK(p.group >= 0 && (p.group == 0 ||
                                   (p.x_group_stride >= p.group * p.x_stride &&
                                    p.y_group_stride >= p.group * p.y_stride)),
                  "rms_norm: group stride < group · stride");
  return absl::OkStatus();
}

absl::Status Validate(const GatedRmsNormParams& p) {
  SS_KERNEL_CHECK(p.rows >= 1 && p.dim >= 1, "gated_rms_norm: empty shape");
  SS_KERNEL_CHECK(p.x && p.y && p.z && p.weight,
                  "gated_rms_norm: null pointer");
  SS_KERNEL_CHECK(
      p.x_stride >= p.dim && p.y_stride >= p.dim && p.z_stride >= p.dim,
      "gated_rms_norm: stride < dim");
  SS_KERNEL_CHECK(p.x != p.y || p.x_stride == p.y_stride,
                  "gated_rms_norm: in place needs equal strides");
  SS_KERNEL_CHECK(
      p.z_group >= 0 &&
          (p.z_group == 0 || p.z_group_stride >= p.z_group * p.z_stride),
      "gated_rms_norm: z group stride < group · z_stride");
  return absl::OkStatus();
}

}  // namespace specserve::kernels
