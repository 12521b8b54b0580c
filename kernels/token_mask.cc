#include "kernels/token_mask.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "kernels/validate.h"

namespace specserve::kernels {

absl::Status Validate(const TokenMaskParams& p) {
  SS_KERNEL_CHECK(p.rows >= 1 && p.cols >= 1, "token mask: empty shape");
  SS_KERNEL_CHECK(p.x && p.row_index && p.allowed && p.argmax,
                  "token mask: null pointer");
  SS_KERNEL_CHECK(p.x_stride >= p.cols, "token mask: stride < cols");
  std::vector<int32_t> rows(p.row_index, p.row_index + p.rows);
  std::sort(rows.begin(), rows.end());
  SS_KERNEL_CHECK(rows.front() >= 0, "token mask: negative row index");
  SS_KERNEL_CHECK(std::adjacent_find(rows.begin(), rows.end()) == rows.end(),
                  "token mask: a row listed twice");
  return absl::OkStatus();
}

int32_t MaskRowAndArgmax(float* row, int64_t cols, const uint32_t* allowed) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  int64_t best = 0;
  for (int64_t c = 0; c < cols; ++c) {
    if (((allowed[c / 32] >> (c % 32)) & 1u) == 0) row[c] = kNegInf;
    // Strictly greater: the first index of the maximum (NaN never wins
    // past index 0, as Argmax).
    if (row[c] > row[best]) best = c;
  }
  return static_cast<int32_t>(best);
}

}  // namespace specserve::kernels
