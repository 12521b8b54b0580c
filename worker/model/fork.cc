// Model::ForkState and Model::Fork (model.h): a new session's caches as an
// exact copy of another's at one of its reusable positions (automatic prefix
// reuse, docs/DESIGN.md "Prefix reuse"). Fork maps the whole pages of the
// source's attention rows below the fork instead of copying them where the
// backend can share memory; no pass rewrites a row below the committed
// length, and a call that lowers the length unshares first
// (ModelState::kv_shared_rows_).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "telemetry/status_macros.h"
#include "worker/model/model.h"

namespace specserve::model {

absl::StatusOr<int> Model::ForkPosition(const ModelState& src,
                                        const TrunkCheckpoint* at,
                                        int capacity) {
  SS_RETURN_IF_ERROR(CheckResident(src));
  if (src.verified_columns_ != 0) {
    return absl::FailedPreconditionError("fork: a verify is pending");
  }
  if (at != nullptr && (at->offloaded || at->length > src.length_ ||
                        at->recurrent.size() != src.linear_.size() ||
                        at->conv.size() != src.linear_.size())) {
    return absl::InvalidArgumentError(
        "fork: the checkpoint does not fit the source state");
  }
  const int pos = at != nullptr ? at->length : src.length_;
  if (pos > capacity) {
    return absl::OutOfRangeError(absl::StrCat(
        "fork: ", pos, " rows exceed the capacity of ", capacity, " rows"));
  }
  return pos;
}

absl::Status Model::ForkState(const ModelState& src, const TrunkCheckpoint* at,
                              ModelState* dst) const {
  SS_RETURN_IF_ERROR(CheckResident(*dst));
  if (dst->length_ != 0 || dst->verified_columns_ != 0) {
    return absl::FailedPreconditionError("fork: the target state is not empty");
  }
  SS_ASSIGN_OR_RETURN(const int pos, ForkPosition(src, at, dst->capacity_));
  // A reset target may still map pages it shared: its own from row 0.
  SS_RETURN_IF_ERROR(UnshareFrom(dst, 0));
  return CopyFork(src, at, pos, 0, dst);
}

absl::StatusOr<std::unique_ptr<ModelState>> Model::Fork(
    const StateOptions& options, const ModelState& src,
    const TrunkCheckpoint* at) const {
  SS_ASSIGN_OR_RETURN(const int pos, ForkPosition(src, at, options.capacity));
  if (options.max_verify_columns < 1 || options.max_verify_columns > kMaxRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("state options: max_verify_columns ",
                     options.max_verify_columns, " (1..", kMaxRows, ")"));
  }
  std::unique_ptr<ModelState> s(new ModelState());
  s->capacity_ = options.capacity;
  s->max_verify_columns_ = options.max_verify_columns;
  s->draft_freed_ = !options.draft_state;
  // A fork that shares pages can lend them onward.
  s->shareable_ = options.shareable || WorthSharing(pos);
  SS_RETURN_IF_ERROR(AllocateCaches(s.get(), &src, pos));
  // Every KV buffer has the same size, so each shares the same pages.
  const size_t kv_from =
      s->kv_.empty() ? 0 : s->borrowed_bytes_ / (2 * s->kv_.size());
  SS_RETURN_IF_ERROR(CopyFork(src, at, pos, kv_from, s.get()));
  return s;
}

absl::Status Model::CopyFork(const ModelState& src, const TrunkCheckpoint* at,
                             int pos, size_t kv_from_bytes,
                             ModelState* dst) const {
  kernels::Backend& be = *backend_;
  const size_t row_bytes = kv_row_bytes();
  const size_t kv_bytes = pos * row_bytes;
  // Rows below pos are never rewritten while `src` lives (every pass writes
  // rows >= the committed length), so they are the rows of the history at
  // pos even when `at` is an earlier checkpoint.
  if (kv_from_bytes < kv_bytes) {
    const size_t n = kv_bytes - kv_from_bytes;
    for (size_t i = 0; i < src.kv_.size(); ++i) {
      SS_RETURN_IF_ERROR(be.CopyOnDevice(
          static_cast<char*>(dst->kv_[i].k.data()) + kv_from_bytes,
          static_cast<const char*>(src.kv_[i].k.data()) + kv_from_bytes, n));
      SS_RETURN_IF_ERROR(be.CopyOnDevice(
          static_cast<char*>(dst->kv_[i].v.data()) + kv_from_bytes,
          static_cast<const char*>(src.kv_[i].v.data()) + kv_from_bytes, n));
    }
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

absl::Status Model::UnshareFrom(ModelState* state, int row) const {
  if (row >= state->kv_shared_rows_) return absl::OkStatus();
  const size_t from = static_cast<size_t>(row) * kv_row_bytes();
  for (KvCache& kv : state->kv_) {
    SS_RETURN_IF_ERROR(backend_->Unshare(kv.k, from));
    SS_RETURN_IF_ERROR(backend_->Unshare(kv.v, from));
  }
  state->kv_shared_rows_ = row;
  state->borrowed_bytes_ =
      std::min<uint64_t>(state->borrowed_bytes_, 2 * from * state->kv_.size());
  // What this state lent is no longer (all) its memory: its forks count
  // the pages they kept as theirs.
  state->lent_.reset();
  return absl::OkStatus();
}

}  // namespace specserve::model
