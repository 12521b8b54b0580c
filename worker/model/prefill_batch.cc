// Model::PrefillBatch: prompt chunks of several sessions in one trunk pass.
// As in VerifyBatch (verify_batch.cc) the rows are one Model::Slice per
// session, so the weights are read once for every session's rows while the
// cache ops run per session on its own caches (in commit mode).
#include <vector>

#include "absl/strings/str_cat.h"
#include "telemetry/status_macros.h"
#include "worker/model/model.h"
#include "worker/model/workspace.h"

namespace specserve::model {

absl::Status Model::PrefillBatch(
    absl::Span<ModelState* const> states,
    absl::Span<const absl::Span<const int32_t>> tokens,
    absl::Span<std::vector<float>* const> all_hidden,
    absl::Span<ForwardResult* const> out) {
  const int B = static_cast<int>(states.size());
  if (B < 1 || tokens.size() != states.size() || out.size() != states.size() ||
      (!all_hidden.empty() && all_hidden.size() != states.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefill batch: ", B, " sessions, ", tokens.size(), " token lists, ",
        all_hidden.size(), " hidden outputs, ", out.size(),
        " outputs (one each, at least one; hidden outputs optional)"));
  }
  int total = 0;
  for (int i = 0; i < B; ++i) {
    SS_RETURN_IF_ERROR(CheckBatchMember(states, i, "prefill batch", false));
    if (out[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("prefill batch: session ", i, ": no output"));
    }
    const absl::Status checked = CheckPrefill(*states[i], tokens[i]);
    if (!checked.ok()) {
      return absl::Status(
          checked.code(),
          absl::StrCat("prefill batch: session ", i, ": ", checked.message()));
    }
    total += static_cast<int>(tokens[i].size());
  }
  if (total > kMaxPrefillRows || B > kMaxRows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefill batch: ", B, " sessions and ", total, " rows in all (at most ",
        kMaxRows, " sessions and ", kMaxPrefillRows, " rows)"));
  }

  std::vector<Slice> slices;
  std::vector<int32_t> flat;
  for (int i = 0; i < B; ++i) {
    const int n = static_cast<int>(tokens[i].size());
    slices.push_back(
        Slice{static_cast<int>(flat.size()), n, states[i]->length_});
    flat.insert(flat.end(), tokens[i].begin(), tokens[i].end());
    // Only the last row comes out, as from Prefill without all_rows.
    out[i]->Clear(states[i]->length_ + n - 1);
  }
  SS_RETURN_IF_ERROR(RunTrunk(states, slices, flat, Mode::kPrefill));
  for (int i = 0; i < B; ++i) states[i]->length_ += slices[i].rows;

  const int64_t H = config_.hidden_size, V = config_.vocab_size;
  kernels::Backend& be = *backend_;
  Workspace& ws = *ws_;
  for (int i = 0; i < B; ++i) {
    std::vector<float>* h = all_hidden.empty() ? nullptr : all_hidden[i];
    if (h == nullptr) continue;
    h->resize(static_cast<size_t>(slices[i].rows) * H);
    SS_RETURN_IF_ERROR(be.CopyToHost(h->data(),
                                     ws.hidden.f32() + slices[i].row0 * H,
                                     slices[i].rows * H * sizeof(float)));
  }
  // Each session's last row goes to last_hidden row i, and one lm_head pass
  // runs over those B rows (row-invariant: a row's logits do not depend on
  // the others).
  for (int i = 0; i < B; ++i) {
    const int last = slices[i].row0 + slices[i].rows - 1;
    SS_RETURN_IF_ERROR(be.CopyOnDevice(ws.last_hidden.f32() + i * H,
                                       ws.hidden.f32() + last * H,
                                       H * sizeof(float)));
  }
  SS_RETURN_IF_ERROR(LmHeadOf(ws.last_hidden.f32(), B));
  lm_head_rows_ = B;
  std::vector<int32_t> flags(2 * B);  // [argmax B | finite B]
  SS_RETURN_IF_ERROR(be.CopyToHost(flags.data(), ws.argmax.data(),
                                   flags.size() * sizeof(int32_t)));
  for (int i = 0; i < B; ++i) {
    const int last = slices[i].row0 + slices[i].rows - 1;
    ForwardResult* r = out[i];
    r->rows = 1;
    if (r->want_logits) {
      r->logits.resize(V);
      SS_RETURN_IF_ERROR(be.CopyToHost(
          r->logits.data(), ws.logits.f32() + i * V, V * sizeof(float)));
    }
    r->hidden.resize(H);
    SS_RETURN_IF_ERROR(be.CopyToHost(
        r->hidden.data(), ws.hidden.f32() + last * H, H * sizeof(float)));
    r->argmax = {flags[i]};
    r->finite = {flags[B + i]};
  }
  return absl::OkStatus();
}

}  // namespace specserve::model
