// Model::MtpDraftBatch: one draft step of several sessions in one MTP pass.
// The rows form a session batch (one row per session, each on its own MTP
// KV cache at its own position), as DecodeBatch's do for the trunk, so the
// head's weights and the shared lm_head are read once for all sessions.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "telemetry/status_macros.h"
#include "worker/model/model.h"
#include "worker/model/workspace.h"

namespace specserve::model {

absl::Status Model::MtpDraftBatch(absl::Span<ModelState* const> states,
                                  absl::Span<const std::vector<float>> hiddens,
                                  absl::Span<const int32_t> tokens,
                                  absl::Span<const int> positions,
                                  absl::Span<ForwardResult* const> out) {
  if (!weights_.has_mtp) {
    return absl::FailedPreconditionError("the checkpoint has no MTP head");
  }
  const int B = static_cast<int>(states.size());
  const int64_t H = config_.hidden_size, V = config_.vocab_size;
  if (B < 1 || B > kMaxRows || hiddens.size() != states.size() ||
      tokens.size() != states.size() || positions.size() != states.size() ||
      out.size() != states.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("mtp draft batch: ", B, " sessions (1..", kMaxRows, "), ",
                     hiddens.size(), " hiddens, ", tokens.size(), " tokens, ",
                     positions.size(), " positions, ", out.size(), " outputs"));
  }
  SS_RETURN_IF_ERROR(CheckTokens(tokens));
  for (int i = 0; i < B; ++i) {
    SS_RETURN_IF_ERROR(CheckBatchMember(states, i, "mtp draft batch", true));
    const ModelState* s = states[i];
    const auto where = [&] {
      return absl::StrCat("mtp draft batch: session ", i);
    };
    if (out[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(where(), ": no output"));
    }
    if (static_cast<int64_t>(hiddens[i].size()) != H) {
      return absl::InvalidArgumentError(absl::StrCat(
          where(), ": ", hiddens[i].size(), " hidden values (H = ", H, ")"));
    }
    if (positions[i] < 0 || positions[i] > s->mtp_length_) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), ": row ", positions[i], " leaves a gap after ",
                       s->mtp_length_, " valid rows"));
    }
    if (positions[i] + 1 > s->capacity_) {
      return absl::OutOfRangeError(absl::StrCat(
          where(), ": row ", positions[i], " is past capacity ", s->capacity_));
    }
  }

  Workspace& ws = *ws_;
  kernels::Backend& be = *backend_;
  std::vector<float> h(static_cast<size_t>(B) * H);
  for (int i = 0; i < B; ++i) {
    std::copy(hiddens[i].begin(), hiddens[i].end(), h.begin() + i * H);
  }
  SS_RETURN_IF_ERROR(
      be.CopyToDevice(ws.mtp_in.data(), h.data(), h.size() * sizeof(float)));
  SS_RETURN_IF_ERROR(UploadIds(tokens));
  // The session table: [K caches B | V caches B | positions B (int32)].
  std::vector<uint64_t> tab(2 * B + (B + 1) / 2, 0);
  int32_t* pos = reinterpret_cast<int32_t*>(tab.data() + 2 * B);
  int max_position = 0;
  for (int i = 0; i < B; ++i) {
    tab[i] = DeviceAddress(states[i]->mtp_kv_.k);
    tab[B + i] = DeviceAddress(states[i]->mtp_kv_.v);
    pos[i] = positions[i];
    max_position = std::max(max_position, positions[i]);
  }
  uint64_t* dev = static_cast<uint64_t*>(ws.batch.data());
  SS_RETURN_IF_ERROR(
      be.CopyToDevice(dev, tab.data(), tab.size() * sizeof(uint64_t)));
  SessionBatch batch;
  batch.sessions = B;
  batch.table = dev;
  batch.k = reinterpret_cast<void* const*>(dev);
  batch.v = reinterpret_cast<void* const*>(dev + B);
  batch.positions = reinterpret_cast<const int32_t*>(dev + 2 * B);
  batch.max_position = max_position;
  SS_RETURN_IF_ERROR(MtpOps(states[0], B, positions[0], &batch));
  for (int i = 0; i < B; ++i) states[i]->mtp_length_ = positions[i] + 1;

  // One lm_head pass, then each session's row out.
  SS_RETURN_IF_ERROR(LmHead(0, B));
  lm_head_rows_ = B;
  std::vector<int32_t> flags(2 * B);  // [argmax B | finite B]
  SS_RETURN_IF_ERROR(be.CopyToHost(flags.data(), ws.argmax.data(),
                                   flags.size() * sizeof(int32_t)));
  for (int i = 0; i < B; ++i) {
    ForwardResult* r = out[i];
    r->Clear(positions[i]);
    r->rows = 1;
    if (r->want_logits) {
      r->logits.resize(V);
      SS_RETURN_IF_ERROR(be.CopyToHost(
          r->logits.data(), ws.logits.f32() + i * V, V * sizeof(float)));
    }
    r->hidden.resize(H);
    SS_RETURN_IF_ERROR(be.CopyToHost(r->hidden.data(), ws.hidden.f32() + i * H,
                                     H * sizeof(float)));
    r->argmax = {flags[i]};
    r->finite = {flags[B + i]};
  }
  return absl::OkStatus();
}

}  // namespace specserve::model
