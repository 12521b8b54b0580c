#include "kernels/scatter_rows.h"

#include "kernels/validate.h"

namespace specserve::kernels {

absl::Status Validate(const ScatterRowsParams& p) {
  SS_KERNEL_CHECK(p.rows >= 1 && p.cols >= 1, "scatter_rows: empty shape");
  SS_KERNEL_CHECK(
      p.src && ((p.dst && p.dst_rows && !p.dst_base) ||
                (!p.dst && !p.dst_rows && p.dst_base)),
      "scatter_rows: null pointer (give dst and dst_rows, or dst_base)");
  SS_KERNEL_CHECK(p.dst_first_row >= 0, "scatter_rows: negative first row");
  SS_KERNEL_CHECK(p.src_stride >= p.cols && p.dst_row_stride >= p.cols,
                  "scatter_rows: stride < cols");
  SS_KERNEL_CHECK(p.dst_dtype == DType::kF32 || p.dst_dtype == DType::kBF16,
                  "scatter_rows: the destination is fp32 or bf16");
  return absl::OkStatus();
}

}  // namespace specserve::kernels
