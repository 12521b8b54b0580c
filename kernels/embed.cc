#include "kernels/embed.h"

#include "kernels/validate.h"

namespace specserve::kernels {

absl::Status Validate(const EmbedParams& p) {
  SS_KERNEL_CHECK(p.rows >= 1 && p.vocab >= 1 && p.dim >= 1,
                  "embed: empty shape");
  SS_KERNEL_CHECK(p.ids && p.table && p.out, "embed: null pointer");
  SS_KERNEL_CHECK(p.out_stride >= p.dim, "embed: out_stride < dim");
  return absl::OkStatus();
}

}  // namespace specserve::kernels
