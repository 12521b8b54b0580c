// Model::ForkState (model.h): a new session's caches as an exact copy of
// another's at one of its reusable positions (automatic prefix reuse,
// docs/DESIGN.md "Prefix reuse"). On the CPU every row is copied; a GPU
// build could share the KV rows [0, pos) copy-on-write instead, since no
// pass ever rewrites a row below the committed length.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "telemetry/status_macros.h"
#include "worker/model/model.h"

namespace specserve::model {

absl::Status Model::ForkState(const ModelState& src, const TrunkCheckpoint* at,
                              ModelState* dst) const {
  SS_RETURN_IF_ERROR(CheckResident(src));
  SS_RETURN_IF_ERROR(CheckResident(*dst));
  if (src.verified_columns_ != 0) {
    return absl::FailedPreconditionError("fork: a verify is pending");
  }
  if (dst->length_ != 0 || dst->verified_columns_ != 0) {
    return absl::FailedPreconditionError("fork: the target state is not empty");
  }
  if (at != nullptr && (at->offloaded || at->length > src.length_ ||
                        at->recurrent.size() != src.linear_.size() ||
                        at->conv.size() != src.linear_.size())) {
    return absl::InvalidArgumentError(
        "fork: the checkpoint does not fit the source state");
  }
  const int pos = at != nullptr ? at->length : src.length_;
  if (pos > dst->capacity_) {
    return absl::OutOfRangeError(absl::StrCat("fork: ", pos,
                                              " rows exceed the capacity of ",
                                              dst->capacity_, " rows"));
  }
  kernels::Backend& be = *backend_;
  const size_t row_bytes = kv_row_bytes();
  // Rows below pos are never rewritten while `src` lives (every pass writes
  // rows >= the committed length), so they are the rows of the history at
  // pos even when `at` is an earlier checkpoint.
  for (size_t i = 0; i < src.kv_.size(); ++i) {
    SS_RETURN_IF_ERROR(be.CopyOnDevice(dst->kv_[i].k.data(),
                                       src.kv_[i].k.data(), pos * row_bytes));
    SS_RETURN_IF_ERROR(be.CopyOnDevice(dst->kv_[i].v.data(),
                                       src.kv_[i].v.data(), pos * row_bytes));
  }
  for (size_t i = 0; i < src.linear_.size(); ++i) {
    const Buffer& rec =
        at != nullptr ? at->recurrent[i] : src.linear_[i].recurrent;
    const Buffer& conv = at != nullptr ? at->conv[i] : src.linear_[i].conv;
    LinearCache& lc = dst->linear_[i];
    SS_RETURN_IF_ERROR(
        be.CopyOnDevice(lc.recurrent.data(), rec.data(), lc.recurrent.bytes()));
    SS_RETURN_IF_ERROR(
        be.CopyOnDevice(lc.conv.data(), conv.data(), lc.conv.bytes()));
  }
  // MTP rows valid at pos: those the checkpoint saw (rows below it are
  // never rewritten either), or all of src's at its committed end.
  int mtp_rows = 0;
  if (src.mtp_kv_.k.data() != nullptr && dst->mtp_kv_.k.data() != nullptr) {
    mtp_rows = at != nullptr ? std::min(at->mtp_length, src.mtp_length_)
                             : src.mtp_length_;
    SS_RETURN_IF_ERROR(be.CopyOnDevice(
        dst->mtp_kv_.k.data(), src.mtp_kv_.k.data(), mtp_rows * row_bytes));
    SS_RETURN_IF_ERROR(be.CopyOnDevice(
        dst->mtp_kv_.v.data(), src.mtp_kv_.v.data(), mtp_rows * row_bytes));
  }
  dst->length_ = pos;
  dst->mtp_length_ = mtp_rows;
  return absl::OkStatus();
}

}  // namespace specserve::model
