// Model's memory functions for the worker's session pool (model.h): byte
// accounting, offload of a session's caches to host memory and their
// restore, and the release of the draft-only buffers on demotion.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "telemetry/status_macros.h"
#include "worker/model/model.h"

namespace specserve::model {

uint64_t TrunkCheckpoint::bytes() const {
  uint64_t n = 0;
  for (const Buffer& b : recurrent) n += b.bytes();
  for (const Buffer& b : conv) n += b.bytes();
  return n;
}

uint64_t TrunkCheckpoint::host_bytes() const {
  uint64_t n = 0;
  for (const std::vector<uint8_t>& x : host_recurrent) n += x.size();
  for (const std::vector<float>& x : host_conv) n += x.size() * sizeof(float);
  return n;
}

uint64_t HostStateSnapshot::bytes() const {
  uint64_t n = mtp_k.size() + mtp_v.size();
  for (const auto* part : {&k, &v, &recurrent}) {
    for (const std::vector<uint8_t>& x : *part) n += x.size();
  }
  for (const std::vector<float>& x : conv) n += x.size() * sizeof(float);
  return n;
}

uint64_t Model::StateBytes(const ModelState& state) const {
  uint64_t n = state.mtp_kv_.k.bytes() + state.mtp_kv_.v.bytes();
  for (const KvCache& kv : state.kv_) n += kv.k.bytes() + kv.v.bytes();
  for (const LinearCache& lc : state.linear_) {
    n += lc.recurrent.bytes() + lc.conv.bytes() + lc.recurrent_columns.bytes() +
         lc.conv_columns.bytes();
  }
  // Pages shared with the source count once, as the source's, while it
  // still holds them; after that every fork that kept them counts them
  // (an over-count, never an under-count, when several did).
  if (!state.lender_.expired()) n -= std::min(n, state.borrowed_bytes_);
  return n;
}

namespace {
// The first `n` floats of `b`, to the host.
absl::Status ToHost(kernels::Backend& be, const Buffer& b, size_t n,
                    std::vector<float>* out) {
  CHECK_LE(n * sizeof(float), b.bytes()) << "row count past the buffer";
  out->resize(n);
  return be.CopyToHost(out->data(), b.data(), n * sizeof(float));
}
absl::Status ToDevice(kernels::Backend& be, const std::vector<float>& x,
                      const Buffer& b) {
  CHECK_LE(x.size() * sizeof(float), b.bytes()) << "checked by Restore";
  return be.CopyToDevice(b.data(), x.data(), x.size() * sizeof(float));
}
// The first `n` bytes of `b` (cache rows as stored), to the host.
absl::Status BytesToHost(kernels::Backend& be, const Buffer& b, size_t n,
                         std::vector<uint8_t>* out) {
  CHECK_LE(n, b.bytes()) << "row count past the buffer";
  out->resize(n);
  return be.CopyToHost(out->data(), b.data(), n);
}
absl::Status BytesToDevice(kernels::Backend& be, const std::vector<uint8_t>& x,
                           const Buffer& b) {
  CHECK_LE(x.size(), b.bytes()) << "checked by Restore";
  return be.CopyToDevice(b.data(), x.data(), x.size());
}
}  // namespace

absl::StatusOr<std::unique_ptr<HostStateSnapshot>> Model::Offload(
    ModelState* state) const {
  SS_RETURN_IF_ERROR(CheckResident(*state));
  if (state->verified_columns_ != 0) {
    return absl::FailedPreconditionError(
        "offload: a verify is pending (commit or discard it first)");
  }
  kernels::Backend& be = *backend_;
  const size_t row_bytes = kv_row_bytes();
  auto snap = std::make_unique<HostStateSnapshot>();
  snap->length = state->length_;
  const bool mtp = state->mtp_kv_.k.data() != nullptr;
  snap->mtp_length = mtp ? state->mtp_length_ : 0;
  const size_t rows = state->length_, mtp_rows = snap->mtp_length;
  snap->k.resize(state->kv_.size());
  snap->v.resize(state->kv_.size());
  for (size_t i = 0; i < state->kv_.size(); ++i) {
    SS_RETURN_IF_ERROR(
        BytesToHost(be, state->kv_[i].k, rows * row_bytes, &snap->k[i]));
    SS_RETURN_IF_ERROR(
        BytesToHost(be, state->kv_[i].v, rows * row_bytes, &snap->v[i]));
  }
  snap->recurrent.resize(state->linear_.size());
  snap->conv.resize(state->linear_.size());
  for (size_t i = 0; i < state->linear_.size(); ++i) {
    const LinearCache& lc = state->linear_[i];
    SS_RETURN_IF_ERROR(BytesToHost(be, lc.recurrent, recurrent_state_bytes(),
                                   &snap->recurrent[i]));
    SS_RETURN_IF_ERROR(
        ToHost(be, lc.conv, lc.conv.bytes() / sizeof(float), &snap->conv[i]));
  }
  if (mtp) {
    SS_RETURN_IF_ERROR(
        BytesToHost(be, state->mtp_kv_.k, mtp_rows * row_bytes, &snap->mtp_k));
    SS_RETURN_IF_ERROR(
        BytesToHost(be, state->mtp_kv_.v, mtp_rows * row_bytes, &snap->mtp_v));
  }
  // Every copy has landed (CopyToHost returns after the data is on the
  // host); now the backend memory goes back.
  state->kv_.clear();
  state->linear_.clear();
  state->mtp_kv_ = KvCache{};
  // Nothing of the restored state will be shared.
  state->kv_shared_rows_ = 0;
  state->borrowed_bytes_ = 0;
  state->lent_.reset();
  state->lender_.reset();
  state->mtp_length_ = snap->mtp_length;
  state->offloaded_ = true;
  state->verify_steps_.Clear();  // they hold the buffers freed here
  return snap;
}

absl::Status Model::Restore(ModelState* state,
                            const HostStateSnapshot& snap) const {
  if (!state->offloaded_ && state->verified_columns_ != 0) {
    return absl::FailedPreconditionError(
        "restore: a verify is pending (commit or discard it first)");
  }
  const ModelConfig& c = config_;
  const size_t row_bytes = kv_row_bytes();
  const size_t num_full = c.num_full_attention_layers();
  const size_t num_linear = c.num_hidden_layers - num_full;
  const size_t rec = recurrent_state_bytes();
  const size_t conv =
      static_cast<size_t>(c.conv_dim()) * (c.linear_conv_kernel_dim - 1);
  bool fits = snap.length >= 0 && snap.length <= state->capacity_ &&
              snap.mtp_length >= 0 && snap.mtp_length <= state->capacity_ &&
              snap.k.size() == num_full && snap.v.size() == num_full &&
              snap.recurrent.size() == num_linear &&
              snap.conv.size() == num_linear &&
              (snap.mtp_length == 0 || weights_.has_mtp) &&
              snap.mtp_k.size() == snap.mtp_length * row_bytes &&
              snap.mtp_v.size() == snap.mtp_length * row_bytes;
  for (size_t i = 0; fits && i < num_full; ++i) {
    fits = snap.k[i].size() == snap.length * row_bytes &&
           snap.v[i].size() == snap.length * row_bytes;
  }
  for (size_t i = 0; fits && i < num_linear; ++i) {
    fits = snap.recurrent[i].size() == rec && snap.conv[i].size() == conv;
  }
  if (!fits) {
    return absl::InvalidArgumentError(
        absl::StrCat("restore: the snapshot (", snap.length,
                     " rows) does not fit a state "
                     "of capacity ",
                     state->capacity_, " of this model"));
  }
  // Allocate aside first so that a failure leaves the state as it was.
  ModelState fresh;
  ModelState* target = state;
  if (state->offloaded_) {
    fresh.capacity_ = state->capacity_;
    fresh.max_verify_columns_ = state->max_verify_columns_;
    fresh.draft_freed_ = state->draft_freed_;
    fresh.shareable_ = state->shareable_;
    fresh.share_rows_ = state->share_rows_;
    SS_RETURN_IF_ERROR(AllocateCaches(&fresh));
    target = &fresh;
  }
  // In place, every row from 0 is rewritten: this state's own pages.
  if (target == state) SS_RETURN_IF_ERROR(UnshareFrom(state, 0));
  kernels::Backend& be = *backend_;
  for (size_t i = 0; i < num_full; ++i) {
    SS_RETURN_IF_ERROR(BytesToDevice(be, snap.k[i], target->kv_[i].k));
    SS_RETURN_IF_ERROR(BytesToDevice(be, snap.v[i], target->kv_[i].v));
  }
  for (size_t i = 0; i < num_linear; ++i) {
    SS_RETURN_IF_ERROR(
        BytesToDevice(be, snap.recurrent[i], target->linear_[i].recurrent));
    SS_RETURN_IF_ERROR(ToDevice(be, snap.conv[i], target->linear_[i].conv));
  }
  const bool mtp = target->mtp_kv_.k.data() != nullptr;
  if (mtp) {
    SS_RETURN_IF_ERROR(BytesToDevice(be, snap.mtp_k, target->mtp_kv_.k));
    SS_RETURN_IF_ERROR(BytesToDevice(be, snap.mtp_v, target->mtp_kv_.v));
  }
  if (target == &fresh) {
    state->kv_ = std::move(fresh.kv_);
    state->linear_ = std::move(fresh.linear_);
    state->mtp_kv_ = std::move(fresh.mtp_kv_);
    state->offloaded_ = false;
  }
  state->length_ = snap.length;
  state->mtp_length_ = mtp ? snap.mtp_length : 0;
  state->verified_columns_ = 0;
  state->graph_fallback_ = false;  // resumed: recorded steps are tried again
  state->verify_steps_.Clear();    // recorded against the old buffers
  return absl::OkStatus();
}

absl::Status Model::OffloadCheckpoint(TrunkCheckpoint* checkpoint) const {
  if (checkpoint->offloaded) {
    return absl::FailedPreconditionError("checkpoint is already offloaded");
  }
  kernels::Backend& be = *backend_;
  std::vector<std::vector<uint8_t>> recurrent(checkpoint->recurrent.size());
  std::vector<std::vector<float>> conv(checkpoint->conv.size());
  for (size_t i = 0; i < recurrent.size(); ++i) {
    const Buffer& b = checkpoint->recurrent[i];
    SS_RETURN_IF_ERROR(BytesToHost(be, b, b.bytes(), &recurrent[i]));
  }
  for (size_t i = 0; i < conv.size(); ++i) {
    const Buffer& b = checkpoint->conv[i];
    SS_RETURN_IF_ERROR(ToHost(be, b, b.bytes() / sizeof(float), &conv[i]));
  }
  // Every copy has landed: the backend memory goes back.
  checkpoint->recurrent.clear();
  checkpoint->conv.clear();
  checkpoint->host_recurrent = std::move(recurrent);
  checkpoint->host_conv = std::move(conv);
  checkpoint->offloaded = true;
  return absl::OkStatus();
}

absl::Status Model::ReloadCheckpoint(TrunkCheckpoint* checkpoint) const {
  if (!checkpoint->offloaded) return absl::OkStatus();
  kernels::Backend& be = *backend_;
  // Allocated aside first, so that a failure leaves it offloaded.
  std::vector<Buffer> recurrent, conv;
  for (const std::vector<uint8_t>& x : checkpoint->host_recurrent) {
    SS_ASSIGN_OR_RETURN(Buffer b, be.Allocate(x.size()));
    SS_RETURN_IF_ERROR(BytesToDevice(be, x, b));
    recurrent.push_back(std::move(b));
  }
  for (const std::vector<float>& x : checkpoint->host_conv) {
    SS_ASSIGN_OR_RETURN(Buffer b, be.AllocateFloats(x.size()));
    SS_RETURN_IF_ERROR(ToDevice(be, x, b));
    conv.push_back(std::move(b));
  }
  checkpoint->recurrent = std::move(recurrent);
  checkpoint->conv = std::move(conv);
  checkpoint->host_recurrent.clear();
  checkpoint->host_conv.clear();
  checkpoint->offloaded = false;
  return absl::OkStatus();
}

absl::Status Model::FreeDraftState(ModelState* state) const {
  if (state->verified_columns_ != 0) {
    return absl::FailedPreconditionError(
        "free draft state: a verify is pending (commit or discard it first)");
  }
  state->draft_freed_ = true;
  state->verify_steps_.Clear();  // they hold the capture buffers freed here
  state->mtp_kv_ = KvCache{};
  for (LinearCache& lc : state->linear_) {
    lc.recurrent_columns.Reset();
    lc.conv_columns.Reset();
  }
  state->mtp_length_ = 0;
  return absl::OkStatus();
}

}  // namespace specserve::model
