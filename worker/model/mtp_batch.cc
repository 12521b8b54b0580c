// Model::MtpBatch: MTP rows of several sessions in one pass. The rows form a
// session batch (each row on its own session's MTP KV cache at its own
// position), as DecodeBatch's do for the trunk, so the head's weights and the
// shared lm_head are read once for all sessions. A session may bring several
// consecutive rows (rows it owes plus a draft step): every row's keys and
// values are written before any row attends, so a row sees the rows before
// it in the same pass exactly as it would have after a pass of its own.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "telemetry/status_macros.h"
#include "worker/model/model.h"
#include "worker/model/workspace.h"

namespace specserve::model {

absl::Status Model::MtpBatch(absl::Span<ModelState* const> states,
                             absl::Span<const MtpRows> rows,
                             absl::Span<ForwardResult* const> out) {
  if (!weights_.has_mtp) {
    return absl::FailedPreconditionError("the checkpoint has no MTP head");
  }
  const int B = static_cast<int>(states.size());
  const int64_t H = config_.hidden_size, V = config_.vocab_size;
  if (B < 1 || B > kMaxRows || rows.size() != states.size() ||
      out.size() != states.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("mtp batch: ", B, " sessions (1..", kMaxRows, "), ",
                     rows.size(), " row sets, ", out.size(), " outputs"));
  }
  int total = 0;
  for (int i = 0; i < B; ++i) {
    SS_RETURN_IF_ERROR(CheckBatchMember(states, i, "mtp batch", true));
    const ModelState* s = states[i];
    const MtpRows& r = rows[i];
    const auto where = [&] { return absl::StrCat("mtp batch: session ", i); };
    const int n = static_cast<int>(r.tokens.size());
    if (n < 1 || static_cast<int64_t>(r.hiddens.size()) != n * H) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), ": ", n, " tokens and ", r.hiddens.size(),
                       " hidden values (H = ", H, ")"));
    }
    SS_RETURN_IF_ERROR(CheckTokens(r.tokens));
    if (r.first_row < 0 || r.first_row > s->mtp_length_) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), ": row ", r.first_row, " leaves a gap after ",
                       s->mtp_length_, " valid rows"));
    }
    if (r.first_row + n > s->capacity_) {
      return absl::OutOfRangeError(
          absl::StrCat(where(), ": rows [", r.first_row, ", ", r.first_row + n,
                       ") exceed capacity ", s->capacity_));
    }
    total += n;
  }
  if (total > kMaxRows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mtp batch: ", total, " rows in all (at most ", kMaxRows, ")"));
  }

  Workspace& ws = *ws_;
  kernels::Backend& be = *backend_;
  std::vector<float> h(static_cast<size_t>(total) * H);
  std::vector<int32_t> ids;
  ids.reserve(total);
  // The session table: [K caches R | V caches R | positions R (int32)], one
  // entry per row; last[i] = session i's last row.
  std::vector<uint64_t> tab(2 * total + (total + 1) / 2, 0);
  int32_t* pos = reinterpret_cast<int32_t*>(tab.data() + 2 * total);
  std::vector<int> last(B);
  int row = 0, max_position = 0;
  for (int i = 0; i < B; ++i) {
    const MtpRows& r = rows[i];
    std::copy(r.hiddens.begin(), r.hiddens.end(), h.begin() + row * H);
    ids.insert(ids.end(), r.tokens.begin(), r.tokens.end());
    for (size_t j = 0; j < r.tokens.size(); ++j, ++row) {
      tab[row] = DeviceAddress(states[i]->mtp_kv_.k);
      tab[total + row] = DeviceAddress(states[i]->mtp_kv_.v);
      pos[row] = r.first_row + static_cast<int>(j);
      max_position = std::max(max_position, pos[row]);
    }
    last[i] = row - 1;
  }
  SS_RETURN_IF_ERROR(
      be.CopyToDevice(ws.mtp_in.data(), h.data(), h.size() * sizeof(float)));
  SS_RETURN_IF_ERROR(UploadIds(ids));
  uint64_t* dev = static_cast<uint64_t*>(ws.batch.data());
  SS_RETURN_IF_ERROR(
      be.CopyToDevice(dev, tab.data(), tab.size() * sizeof(uint64_t)));
  SessionBatch batch;
  batch.sessions = total;
  batch.table = dev;
  batch.k = reinterpret_cast<void* const*>(dev);
  batch.v = reinterpret_cast<void* const*>(dev + total);
  batch.positions = reinterpret_cast<const int32_t*>(dev + 2 * total);
  batch.max_position = max_position;
  SS_RETURN_IF_ERROR(MtpOps(states[0], total, pos[0], &batch));
  for (int i = 0; i < B; ++i) {
    states[i]->mtp_length_ =
        rows[i].first_row + static_cast<int>(rows[i].tokens.size());
  }

  // One lm_head pass over the sessions' last rows (row i = session i; the
  // lm_head is row-invariant, so where a row sits does not change its bits).
  const float* head_in = ws.hidden.f32();
  if (total > B) {
    for (int i = 0; i < B; ++i) {
      SS_RETURN_IF_ERROR(be.CopyOnDevice(ws.last_hidden.f32() + i * H,
                                         ws.hidden.f32() + last[i] * H,
                                         H * sizeof(float)));
    }
    head_in = ws.last_hidden.f32();
  }
  SS_RETURN_IF_ERROR(LmHeadOf(head_in, B));
  lm_head_rows_ = B;
  PassMasks masks;
  for (int i = 0; i < B; ++i) {
    if (out[i] != nullptr) {
      SS_RETURN_IF_ERROR(GatherMasks(*out[i], 0, 1, i, &masks));
    }
  }
  SS_RETURN_IF_ERROR(ApplyMasks(masks));
  std::vector<int32_t> flags(2 * B);  // [argmax B | finite B]
  SS_RETURN_IF_ERROR(be.CopyToHost(flags.data(), ws.argmax.data(),
                                   flags.size() * sizeof(int32_t)));
  for (int i = 0; i < B; ++i) {
    ForwardResult* r = out[i];
    if (r == nullptr) continue;
    r->Clear(pos[last[i]]);
    r->rows = 1;
    if (r->want_logits) {
      r->logits.resize(V);
      SS_RETURN_IF_ERROR(be.CopyToHost(
          r->logits.data(), ws.logits.f32() + i * V, V * sizeof(float)));
    }
    r->hidden.resize(H);
    SS_RETURN_IF_ERROR(be.CopyToHost(
        r->hidden.data(), ws.hidden.f32() + last[i] * H, H * sizeof(float)));
    r->argmax = {flags[i]};
    r->finite = {flags[B + i]};
  }
  return absl::OkStatus();
}

absl::Status Model::MtpDraftBatch(absl::Span<ModelState* const> states,
                                  absl::Span<const std::vector<float>> hiddens,
                                  absl::Span<const int32_t> tokens,
                                  absl::Span<const int> positions,
                                  absl::Span<ForwardResult* const> out) {
  if (hiddens.size() != states.size() || tokens.size() != states.size() ||
      positions.size() != states.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("mtp draft batch: ", states.size(), " sessions, ",
                     hiddens.size(), " hiddens, ", tokens.size(), " tokens, ",
                     positions.size(), " positions"));
  }
  if (std::find(out.begin(), out.end(), nullptr) != out.end()) {
    return absl::InvalidArgumentError("mtp draft batch: a null output");
  }
  std::vector<MtpRows> rows;
  for (size_t i = 0; i < states.size(); ++i) {
    rows.push_back(
        MtpRows{positions[i], hiddens[i], absl::MakeConstSpan(&tokens[i], 1)});
  }
  return MtpBatch(states, rows, out);
}

}  // namespace specserve::model
