#include "kernels/sample_rows.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/validate.h"

namespace specserve::kernels {

SampleRowsParams DenseSampleRows(int64_t rows, const float* x, int64_t cols,
                                 const int32_t* row_index,
                                 const sampling::SamplingConfig* configs) {
  SampleRowsParams p;
  p.rows = rows;
  p.cols = cols;
  p.x = x;
  p.x_stride = cols;
  p.row_index = row_index;
  p.config = configs;
  return p;
}

absl::Status Validate(const SampleRowsParams& p) {
  SS_KERNEL_CHECK(p.rows >= 1 && p.cols >= 1, "sample_rows: empty shape");
  SS_KERNEL_CHECK(p.x != nullptr && p.config != nullptr &&
                      p.uniform != nullptr && p.token != nullptr,
                  "sample_rows: null pointer");
  SS_KERNEL_CHECK(p.x_stride >= p.cols, "sample_rows: x_stride < cols");
  for (int64_t r = 0; r < p.rows; ++r) {
    if (p.row_index != nullptr && p.row_index[r] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample_rows: row_index[", r, "] is negative"));
    }
    if (absl::Status s = sampling::ValidateSamplingConfig(p.config[r]);
        !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample_rows: row ", r, ": ", s.message()));
    }
    if (p.config[r].greedy()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample_rows: row ", r, " is greedy (temperature 0): use Argmax"));
    }
    if (!(p.uniform[r] >= 0.0f && p.uniform[r] < 1.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample_rows: uniform[", r, "] is not in [0, 1)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace specserve::kernels
