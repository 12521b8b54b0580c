#include "worker/spec/row_controls.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "glog/logging.h"
#include "telemetry/status_macros.h"
#include "worker/grammar/grammar.h"

namespace specserve::spec {

RowControls::RowControls(const sampling::LogitAdjustments& adjust,
                         absl::Span<const int32_t> history, int64_t output_len,
                         grammar::GrammarCursor* cursor)
    : adjust_(adjust),
      counts_(history, static_cast<int64_t>(history.size()) - output_len,
              adjust.penalizes()),
      cursor_(cursor) {
  if (cursor_ != nullptr) {
    CHECK_EQ(cursor_->length(), counts_.length())
        << "grammar cursor out of step with the history";
    bitmask_.resize(cursor_->bitmask_words());
  }
}

void RowControls::Push(int32_t token) {
  counts_.Push(token);
  if (cursor_ != nullptr) cursor_->Push(token);
}

void RowControls::PopTo(int64_t length) {
  counts_.PopTo(length);
  if (cursor_ != nullptr) cursor_->PopTo(length);
}

absl::StatusOr<bool> RowControls::AppendMask(std::vector<uint32_t>* words) {
  CHECK(!adjust_.active()) << "logit controls choose on the host";
  if (cursor_ == nullptr) return false;
  SS_ASSIGN_OR_RETURN(const bool masked,
                      cursor_->FillMask(absl::MakeSpan(bitmask_)));
  if (!masked) return false;
  for (int32_t w : bitmask_) words->push_back(static_cast<uint32_t>(w));
  return true;
}

absl::Status RowControls::Apply(absl::Span<float> row) {
  bool masked = false;
  if (cursor_ != nullptr) {
    SS_ASSIGN_OR_RETURN(masked, cursor_->FillMask(absl::MakeSpan(bitmask_)));
  }
  if (!adjust_.active()) {
    // The mask allows at least one token and the row is finite (checked
    // before): it cannot leave nothing.
    if (masked) grammar::ApplyBitmask(bitmask_, row);
    return absl::OkStatus();
  }
  if (masked) raw_.assign(row.begin(), row.end());
  sampling::ApplyLogitAdjustments(adjust_, counts_, row);
  if (!masked) return absl::OkStatus();
  grammar::ApplyBitmask(bitmask_, row);
  const bool any = std::any_of(row.begin(), row.end(), [](float x) {
    return x != -std::numeric_limits<float>::infinity();
  });
  if (!any) {
    std::copy(raw_.begin(), raw_.end(), row.begin());
    grammar::ApplyBitmask(bitmask_, row);
  }
  return absl::OkStatus();
}

}  // namespace specserve::spec
