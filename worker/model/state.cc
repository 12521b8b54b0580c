// Model's session-state functions: creating and resetting caches, keeping a
// verified column, checkpoints, and state inspection (model.h).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "telemetry/status_macros.h"
#include "worker/model/model.h"

namespace specserve::model {

absl::StatusOr<std::unique_ptr<ModelState>> Model::NewState(
    const StateOptions& options) const {
  if (options.capacity < 1 || options.max_verify_columns < 1 ||
      options.max_verify_columns > kMaxRows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state options: capacity ", options.capacity, ", max_verify_columns ",
        options.max_verify_columns, " (1..", kMaxRows, ")"));
  }
  std::unique_ptr<ModelState> s(new ModelState());
  s->capacity_ = options.capacity;
  s->max_verify_columns_ = options.max_verify_columns;
  s->draft_freed_ = !options.draft_state;
  s->shareable_ = options.shareable;
  s->share_rows_ = options.share_rows;
  SS_RETURN_IF_ERROR(AllocateCaches(s.get()));
  return s;
}

absl::Status Model::AllocateCaches(ModelState* s, const ModelState* share_from,
                                   int share_rows) const {
  CHECK(s->kv_.empty() && s->linear_.empty() && s->mtp_kv_.k.data() == nullptr)
      << "AllocateCaches on a state that holds buffers";
  const ModelConfig& c = config_;
  kernels::Backend& be = *backend_;
  const bool draft = !s->draft_freed_;
  const size_t kv_bytes = static_cast<size_t>(s->capacity_) * kv_row_bytes();
  const size_t rec = recurrent_state_bytes();
  const size_t conv =
      static_cast<size_t>(c.conv_dim()) * (c.linear_conv_kernel_dim - 1);
  const size_t cols = s->max_verify_columns_;
  // Trunk KV pages are shareable (Model::Fork); with `share_from` the
  // pages holding its rows [0, share_rows) are mapped, not allocated.
  const size_t share_bytes =
      share_from != nullptr ? static_cast<size_t>(share_rows) * kv_row_bytes()
                            : 0;
  size_t least_shared = share_bytes;
  std::vector<size_t> share_points;
  for (int r : s->share_rows_) {
    share_points.push_back(static_cast<size_t>(r) * kv_row_bytes());
  }
  auto allocate_kv = [&](const Buffer* src) -> absl::StatusOr<Buffer> {
    if (share_bytes == 0 || src == nullptr) {
      return s->shareable_ ? be.AllocateShareable(kv_bytes, share_points)
                           : be.Allocate(kv_bytes);
    }
    size_t shared = 0;
    SS_ASSIGN_OR_RETURN(
        Buffer b,
        be.AllocateSharing(kv_bytes, *src,
                           std::min({share_bytes, kv_bytes, src->bytes()}),
                           &shared));
    least_shared = std::min(least_shared, shared);
    s->borrowed_bytes_ += shared;
    return b;
  };
  for (LayerType t : c.layer_types) {
    if (t == LayerType::kFullAttention) {
      const size_t i = s->kv_.size();
      const bool share = share_from != nullptr && i < share_from->kv_.size();
      KvCache kv;
      SS_ASSIGN_OR_RETURN(kv.k,
                          allocate_kv(share ? &share_from->kv_[i].k : nullptr));
      SS_ASSIGN_OR_RETURN(kv.v,
                          allocate_kv(share ? &share_from->kv_[i].v : nullptr));
      s->kv_.push_back(std::move(kv));
    } else {
      LinearCache lc;
      SS_ASSIGN_OR_RETURN(lc.recurrent, be.Allocate(rec));
      SS_ASSIGN_OR_RETURN(lc.conv, be.AllocateFloats(conv));
      if (draft) {
        SS_ASSIGN_OR_RETURN(lc.recurrent_columns, be.Allocate(cols * rec));
        SS_ASSIGN_OR_RETURN(lc.conv_columns, be.AllocateFloats(cols * conv));
      }
      s->linear_.push_back(std::move(lc));
    }
  }
  if (weights_.has_mtp && draft) {
    SS_ASSIGN_OR_RETURN(s->mtp_kv_.k, be.Allocate(kv_bytes));
    SS_ASSIGN_OR_RETURN(s->mtp_kv_.v, be.Allocate(kv_bytes));
  }
  if (share_from != nullptr && s->borrowed_bytes_ > 0) {
    if (least_shared * 2 * s->kv_.size() != s->borrowed_bytes_) {
      // Unequal shares cannot happen with equal buffers; copy them all.
      return absl::InternalError("fork: the KV buffers shared unequal pages");
    }
    const size_t row_bytes = kv_row_bytes();
    const int rows =
        static_cast<int>((least_shared + row_bytes - 1) / row_bytes);
    s->kv_shared_rows_ = rows;
    share_from->kv_shared_rows_ = std::max(share_from->kv_shared_rows_, rows);
    if (share_from->lent_ == nullptr) {
      share_from->lent_ = std::make_shared<const int>(0);
    }
    s->lender_ = share_from->lent_;
  }
  return absl::OkStatus();
}

bool Model::WorthSharing(int rows) const {
  const size_t page = backend_->SharingPageBytes();
  return page > 0 && static_cast<size_t>(rows) * kv_row_bytes() >= page;
}

absl::Status Model::Reset(ModelState* state) const {
  SS_RETURN_IF_ERROR(CheckResident(*state));
  for (LinearCache& lc : state->linear_) {
    SS_RETURN_IF_ERROR(
        backend_->Zero(lc.recurrent.data(), lc.recurrent.bytes()));
    SS_RETURN_IF_ERROR(backend_->Zero(lc.conv.data(), lc.conv.bytes()));
  }
  // KV rows past the length are never read, so they need no clearing; the
  // rows written next must be this state's own.
  SS_RETURN_IF_ERROR(UnshareFrom(state, 0));
  state->length_ = 0;
  state->mtp_length_ = 0;
  state->verified_columns_ = 0;
  return absl::OkStatus();
}

absl::Status Model::CommitVerified(ModelState* state, int column) {
  SS_RETURN_IF_ERROR(CheckResident(*state));
  if (column < 0 || column >= state->verified_columns_) {
    return absl::InvalidArgumentError(
        absl::StrCat("commit: column ", column, " of ",
                     state->verified_columns_, " verified"));
  }
  kernels::Backend& be = *backend_;
  for (LinearCache& lc : state->linear_) {
    const size_t rec = lc.recurrent.bytes(), conv = lc.conv.bytes();
    SS_RETURN_IF_ERROR(be.CopyOnDevice(
        lc.recurrent.data(),
        static_cast<const char*>(lc.recurrent_columns.data()) + column * rec,
        rec));
    SS_RETURN_IF_ERROR(be.CopyOnDevice(
        lc.conv.data(),
        static_cast<const char*>(lc.conv_columns.data()) + column * conv,
        conv));
  }
  state->length_ += column + 1;
  state->verified_columns_ = 0;
  return absl::OkStatus();
}

void Model::DiscardVerified(ModelState* state) const {
  state->verified_columns_ = 0;
}

absl::Status Model::ReadLinearState(const ModelState& state, int index,
                                    int column, std::vector<float>* recurrent,
                                    std::vector<float>* conv) const {
  SS_RETURN_IF_ERROR(CheckResident(state));
  if (index < 0 || index >= static_cast<int>(state.linear_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("no linear layer ", index));
  }
  if (column >= state.verified_columns_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "column ", column, " of ", state.verified_columns_, " verified"));
  }
  const LinearCache& lc = state.linear_[index];
  const size_t rec = lc.recurrent.bytes(), cv = lc.conv.bytes();
  conv->resize(cv / sizeof(float));
  const char* rsrc =
      column < 0 ? static_cast<const char*>(lc.recurrent.data())
                 : static_cast<const char*>(lc.recurrent_columns.data()) +
                       column * rec;
  const char* csrc =
      column < 0
          ? static_cast<const char*>(lc.conv.data())
          : static_cast<const char*>(lc.conv_columns.data()) + column * cv;
  if (rec_dtype_ == kernels::DType::kBF16) {
    std::vector<uint16_t> stored(rec / sizeof(uint16_t));
    SS_RETURN_IF_ERROR(backend_->CopyToHost(stored.data(), rsrc, rec));
    recurrent->resize(stored.size());
    for (size_t i = 0; i < stored.size(); ++i) {
      const uint32_t bits = uint32_t{stored[i]} << 16;  // exact widening
      std::memcpy(&(*recurrent)[i], &bits, sizeof(float));
    }
  } else {
    recurrent->resize(rec / sizeof(float));
    SS_RETURN_IF_ERROR(backend_->CopyToHost(recurrent->data(), rsrc, rec));
  }
  return backend_->CopyToHost(conv->data(), csrc, cv);
}

absl::StatusOr<std::unique_ptr<TrunkCheckpoint>> Model::SaveCheckpoint(
    const ModelState& state) const {
  SS_RETURN_IF_ERROR(CheckResident(state));
  if (state.verified_columns_ != 0) {
    return absl::FailedPreconditionError("checkpoint: a verify is pending");
  }
  auto cp = std::make_unique<TrunkCheckpoint>();
  cp->length = state.length_;
  cp->mtp_length = state.mtp_length_;
  kernels::Backend& be = *backend_;
  for (const LinearCache& lc : state.linear_) {
    SS_ASSIGN_OR_RETURN(Buffer rec, be.Allocate(lc.recurrent.bytes()));
    SS_ASSIGN_OR_RETURN(Buffer conv, be.Allocate(lc.conv.bytes()));
    SS_RETURN_IF_ERROR(
        be.CopyOnDevice(rec.data(), lc.recurrent.data(), rec.bytes()));
    SS_RETURN_IF_ERROR(
        be.CopyOnDevice(conv.data(), lc.conv.data(), conv.bytes()));
    cp->recurrent.push_back(std::move(rec));
    cp->conv.push_back(std::move(conv));
  }
  return cp;
}

absl::Status Model::RestoreCheckpoint(ModelState* state,
                                      const TrunkCheckpoint& cp) const {
  SS_RETURN_IF_ERROR(CheckResident(*state));
  if (cp.offloaded) {
    return absl::FailedPreconditionError(
        "checkpoint is offloaded (ReloadCheckpoint first)");
  }
  if (cp.recurrent.size() != state->linear_.size() ||
      cp.conv.size() != state->linear_.size() || cp.length > state->capacity_) {
    return absl::InvalidArgumentError("checkpoint does not fit this state");
  }
  // The rows from cp.length on are written next: this state's own pages.
  SS_RETURN_IF_ERROR(UnshareFrom(state, cp.length));
  kernels::Backend& be = *backend_;
  for (size_t i = 0; i < state->linear_.size(); ++i) {
    LinearCache& lc = state->linear_[i];
    SS_RETURN_IF_ERROR(be.CopyOnDevice(
        lc.recurrent.data(), cp.recurrent[i].data(), lc.recurrent.bytes()));
    SS_RETURN_IF_ERROR(
        be.CopyOnDevice(lc.conv.data(), cp.conv[i].data(), lc.conv.bytes()));
  }
  state->length_ = cp.length;
  state->mtp_length_ = std::min(state->mtp_length_, cp.mtp_length);
  state->verified_columns_ = 0;
  return absl::OkStatus();
}

absl::Status Model::TruncateMtp(ModelState* state, int rows) const {
  SS_RETURN_IF_ERROR(CheckResident(*state));
  if (rows < 0) return absl::InvalidArgumentError("mtp: negative row count");
  state->mtp_length_ = std::min(state->mtp_length_, rows);
  return absl::OkStatus();
}

}  // namespace specserve::model
