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
  SS_KERNEL_CHECK(p.x != nullptr && p.config != nullptr, "sample_rows: null pointer");
  SS_KERNEL_CHECK(p.token != nullptr || p.probs != nullptr,
                  "sample_rows: neither token nor probs asked for");
  SS_KERNEL_CHECK(p.token == nullptr || p.uniform != nullptr, "sample_rows: null uniform");
  SS_KERNEL_CHECK(p.x_stride >= p.cols, "sample_rows: x_stride < cols");
  SS_KERNEL_CHECK(p.probs == nullptr || p.probs_stride >= p.cols,
                  "sample_rows: probs_stride < cols");
  for (int64_t r = 0; r < p.rows; ++r) {
    if (p.row_index != nullptr && p.row_index[r] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample_rows: row_index[", r, "] is negative"));
    }
    if (absl::Status s = sampling::ValidateSamplingConfig(p.config[r]); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("sample_rows: row ", r, ": ", s.message()));
    }
    if (p.config[r].greedy()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample_rows: row ", r, " is greedy (temperature 0): use Argmax"));
    }
    if (p.token != nullptr && !(p.uniform[r] >= 0.0f && p.uniform[r] < 1.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample_rows: uniform[", r, "] is not in [0, 1)"));
    }
  }
  return absl::OkStatus();
}

absl::Status Validate(const DrawFromProbsParams& p) {
  SS_KERNEL_CHECK(p.cols >= 1, "draw_from_probs: empty row");
  SS_KERNEL_CHECK(p.p != nullptr && p.token != nullptr, "draw_from_probs: null pointer");
  SS_KERNEL_CHECK(p.uniform >= 0.0f && p.uniform < 1.0f,
                  "draw_from_probs: uniform is not in [0, 1)");
  return absl::OkStatus();
}

absl::Status Validate(const AcceptRoundParams& p) {
  SS_KERNEL_CHECK(p.cols >= 1, "accept_round: empty rows");
  SS_KERNEL_CHECK(p.k >= 1 && p.k <= kMaxAcceptDrafts, "accept_round: k outside 1..16");
  SS_KERNEL_CHECK(p.drafts != nullptr && p.q != nullptr && p.p != nullptr &&
                      p.accepted != nullptr && p.bonus != nullptr,
                  "accept_round: null pointer");
  SS_KERNEL_CHECK(p.q_stride >= p.cols && p.p_stride >= p.cols, "accept_round: stride < cols");
  for (int i = 0; i < p.k; ++i) {
    SS_KERNEL_CHECK(p.drafts[i] >= 0 && p.drafts[i] < p.cols,
                    "accept_round: a draft outside the vocabulary");
  }
  return absl::OkStatus();
}

}  // namespace specserve::kernels
