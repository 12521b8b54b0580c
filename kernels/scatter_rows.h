// Copies row t of a [rows][cols] fp32 source to its own destination row:
//   dst[t] + dst_rows[t]·dst_row_stride  ←  src + t·src_stride   (cols floats)
// dst and dst_rows are arrays in backend memory. DecodeBatch uses it to put
// each session's new key/value row into that session's cache at its own
// position in one call. Without dst/dst_rows (both null), the rows go to
// consecutive rows of one buffer instead:
//   dst_base + (dst_first_row + t)·dst_row_stride  ←  src + t·src_stride
// (a strided block copy: one session's new keys into its cache).
// Destinations must not overlap each other or src. The destination rows
// hold dst_dtype elements: fp32 (a copy), or bf16 (each value rounded to
// nearest even: a bf16 KV cache, kernels/attention.h).
#ifndef SPECSERVE_KERNELS_SCATTER_ROWS_H_
#define SPECSERVE_KERNELS_SCATTER_ROWS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/types.h"

namespace specserve::kernels {

struct ScatterRowsParams {
  int64_t rows = 0;
  int64_t cols = 0;
  const float* src = nullptr;  // [rows][src_stride]
  int64_t src_stride = 0;
  void* const* dst = nullptr;         // [rows] base pointers
  const int32_t* dst_rows = nullptr;  // [rows] row index within dst[t]
  int64_t dst_row_stride = 0;         // elements
  void* dst_base = nullptr;           // the one destination when dst is null
  int64_t dst_first_row = 0;
  DType dst_dtype = DType::kF32;  // kF32 or kBF16
};

absl::Status Validate(const ScatterRowsParams& p);

}  // namespace specserve::kernels

#endif  // SPECSERVE_KERNELS_SCATTER_ROWS_H_
