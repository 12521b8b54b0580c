// The MTP head (docs/MODEL.md "MTP head"): row p reads the trunk hidden h_p and
// the next token t_{p+1}, runs one full-attention decoder layer over its own
// KV cache at RoPE position p and predicts t_{p+2} through the shared
// lm_head.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "telemetry/status_macros.h"
#include "worker/model/model.h"
#include "worker/model/workspace.h"

namespace specserve::model {

absl::Status Model::MtpForward(ModelState* state,
                               absl::Span<const float> hiddens,
                               absl::Span<const int32_t> next_tokens,
                               int first_row, ForwardResult* out) {
  if (!weights_.has_mtp) {
    return absl::FailedPreconditionError("the checkpoint has no MTP head");
  }
  SS_RETURN_IF_ERROR(CheckResident(*state));
  if (state->draft_freed_) {
    return absl::FailedPreconditionError(
        "mtp: the draft state was freed (FreeDraftState)");
  }
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size;
  const int n = static_cast<int>(next_tokens.size());
  if (n < 1 || static_cast<int64_t>(hiddens.size()) != n * H) {
    return absl::InvalidArgumentError(
        absl::StrCat("mtp: ", n, " tokens and ", hiddens.size(),
                     " hidden values (H = ", H, ")"));
  }
  if (first_row < 0 || first_row > state->mtp_length_) {
    return absl::InvalidArgumentError(
        absl::StrCat("mtp: first row ", first_row, " leaves a gap after ",
                     state->mtp_length_, " valid rows"));
  }
  if (first_row + n > state->capacity_) {
    return absl::OutOfRangeError(
        absl::StrCat("mtp: rows [", first_row, ", ", first_row + n,
                     ") exceed capacity ", state->capacity_));
  }
  SS_RETURN_IF_ERROR(CheckTokens(next_tokens));
  if (out != nullptr) out->Clear(first_row);
  if (n == 1 && out != nullptr) {
    ModelState* const one[] = {state};
    if (GraphsApply(one)) {
      return MtpRowRecorded(state, hiddens, next_tokens[0], first_row, out);
    }
  }
  for (int i0 = 0; i0 < n; i0 += kMaxRows) {
    const int rows = std::min(kMaxRows, n - i0);
    const int start = first_row + i0;
    SS_RETURN_IF_ERROR(backend_->CopyToDevice(
        ws_->mtp_in.data(), hiddens.data() + i0 * H, rows * H * sizeof(float)));
    SS_RETURN_IF_ERROR(UploadIds(next_tokens.subspan(i0, rows)));
    SS_RETURN_IF_ERROR(MtpOps(state, rows, start, /*batch=*/nullptr));
    state->mtp_length_ = start + rows;
    if (out != nullptr) SS_RETURN_IF_ERROR(EmitRows(0, rows, out));
  }
  return absl::OkStatus();
}

absl::Status Model::MtpOps(ModelState* state, int rows, int start,
                           const SessionBatch* batch) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size;
  kernels::Backend& be = *backend_;
  Workspace& ws = *ws_;
  const MtpWeights& m = weights_.mtp;
  SS_RETURN_IF_ERROR(EmbedUploaded(rows));
  // mtp_cat = [norm_emb(embed(t)) | norm_hid(h)], then u = fc(mtp_cat).
  kernels::RmsNormParams norm;
  norm.rows = rows;
  norm.dim = H;
  norm.x = ws.h.f32();
  norm.x_stride = H;
  norm.y = ws.mtp_cat.f32();
  norm.y_stride = 2 * H;
  norm.weight = m.pre_fc_norm_embedding.f32();
  norm.eps = c.rms_norm_eps;
  SS_RETURN_IF_ERROR(be.RmsNorm(norm));
  norm.x = ws.mtp_in.f32();
  norm.y = ws.mtp_cat.f32() + H;
  norm.weight = m.pre_fc_norm_hidden.f32();
  SS_RETURN_IF_ERROR(be.RmsNorm(norm));
  SS_RETURN_IF_ERROR(be.Matmul(
      kernels::DenseMatmul(rows, ws.mtp_cat.f32(), m.fc, ws.h.f32())));

  // One decoder layer on the MTP cache (its norms fused into the blocks'
  // matmuls), then the head's norm.
  KvCache* kv = &state->mtp_kv_;
  const Slice slice{0, rows, start};
  // The exact ops: the head's rows are draft steps (and their fills).
  SS_RETURN_IF_ERROR(FullAttentionBlock(m.layer, absl::MakeConstSpan(&kv, 1),
                                        absl::MakeConstSpan(&slice, 1),
                                        Mode::kCommit, rows, batch));
  SS_RETURN_IF_ERROR(MlpBlock(m.layer, Mode::kCommit, rows));
  norm.x = ws.h.f32();
  norm.y = ws.hidden.f32();
  norm.y_stride = H;
  norm.weight = m.norm.f32();
  return be.RmsNorm(norm);
}

absl::Status Model::MtpRowRecorded(ModelState* state,
                                   absl::Span<const float> hidden,
                                   int32_t token, int row, ForwardResult* out) {
  const int64_t H = config_.hidden_size;
  Workspace& ws = *ws_;
  // The step's inputs into fixed buffers: the hidden, the id, and a
  // one-row table (MTP K and V cache, the row's position) at the start of
  // ws.batch, the buffer every recorded step's table goes through.
  SS_RETURN_IF_ERROR(backend_->CopyToDevice(ws.mtp_in.data(), hidden.data(),
                                            H * sizeof(float)));
  SS_RETURN_IF_ERROR(UploadIds(absl::MakeConstSpan(&token, 1)));
  uint64_t tab[3] = {DeviceAddress(state->mtp_kv_.k),
                     DeviceAddress(state->mtp_kv_.v), 0};
  const int32_t row32 = row;
  std::memcpy(&tab[2], &row32,
              sizeof(row32));  // the low half: the device reads an int32
  uint64_t* dev = static_cast<uint64_t*>(ws.batch.data());
  SS_RETURN_IF_ERROR(backend_->CopyToDevice(dev, tab, sizeof(tab)));
  SessionBatch batch;
  batch.sessions = 1;
  batch.table = dev;
  batch.k = reinterpret_cast<void* const*>(dev);
  batch.v = reinterpret_cast<void* const*>(dev + 1);
  batch.positions = reinterpret_cast<const int32_t*>(dev + 2);
  batch.max_position = GraphBucketLast(row);
  ModelState* const one[] = {state};
  SS_RETURN_IF_ERROR(RunRecorded(
      &steps_, {static_cast<int>(StepKind::kMtpDraft), 1, batch.max_position},
      one, [&] {
        SS_RETURN_IF_ERROR(MtpOps(state, 1, row, &batch));
        return LmHead(0, 1);
      }));
  state->mtp_length_ = row + 1;
  return CopyRowsOut(0, 1, out);
}

absl::Status Model::MtpDraft(ModelState* state, absl::Span<const float> hidden,
                             int32_t token, int position, ForwardResult* out) {
  return MtpForward(state, hidden, absl::MakeConstSpan(&token, 1), position,
                    out);
}

}  // namespace specserve::model
