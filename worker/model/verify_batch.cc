// Model::VerifyBatch: the verify columns of several sessions in one trunk
// pass. Like DecodeBatch (batch.cc) the rows are one Model::Slice per
// session, so the weights are read once for every session's columns, while
// the cache ops run per session in verify mode (blocks.cc: each session's
// recurrent and conv states captured per column in its own buffers).
#include <vector>

#include "absl/strings/str_cat.h"
#include "telemetry/status_macros.h"
#include "worker/model/model.h"
#include "worker/model/workspace.h"

namespace specserve::model {

absl::Status Model::VerifyBatch(absl::Span<ModelState* const> states,
                                absl::Span<const std::vector<int32_t>> columns,
                                absl::Span<ForwardResult* const> out) {
  const int B = static_cast<int>(states.size());
  if (B < 1 || columns.size() != states.size() || out.size() != states.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "verify batch: ", B, " sessions, ", columns.size(), " column lists, ",
        out.size(), " outputs (one each, at least one)"));
  }
  int total = 0;
  for (int i = 0; i < B; ++i) {
    SS_RETURN_IF_ERROR(CheckBatchMember(states, i, "verify batch", true));
    const ModelState* s = states[i];
    const auto where = [&] {
      return absl::StrCat("verify batch: session ", i);
    };
    if (out[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(where(), ": no output"));
    }
    if (s->verified_columns_ != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(where(), ": a verify is already pending"));
    }
    const int n = static_cast<int>(columns[i].size());
    if (n < 1 || n > s->max_verify_columns_) {
      return absl::InvalidArgumentError(absl::StrCat(
          where(), ": ", n, " columns (1..", s->max_verify_columns_, ")"));
    }
    SS_RETURN_IF_ERROR(CheckTokens(columns[i]));
    if (s->length_ + n > s->capacity_) {
      return absl::OutOfRangeError(
          absl::StrCat(where(), ": ", s->length_, " committed + ", n,
                       " columns exceed capacity ", s->capacity_));
    }
    total += n;
  }
  if (total > kMaxRows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "verify batch: ", total, " columns in all (at most ", kMaxRows, ")"));
  }

  std::vector<Slice> slices;
  std::vector<int32_t> tokens;
  for (int i = 0; i < B; ++i) {
    slices.push_back(Slice{static_cast<int>(tokens.size()),
                           static_cast<int>(columns[i].size()),
                           states[i]->length_});
    tokens.insert(tokens.end(), columns[i].begin(), columns[i].end());
    out[i]->Clear(states[i]->length_);
  }
  SS_RETURN_IF_ERROR(RunTrunk(states, slices, tokens, Mode::kVerify));
  for (int i = 0; i < B; ++i) {
    states[i]->verified_columns_ = slices[i].rows;
  }

  // One lm_head pass over every column, then each session's rows out.
  SS_RETURN_IF_ERROR(LmHead(0, total));
  lm_head_rows_ = total;
  PassMasks masks;
  for (int i = 0; i < B; ++i) {
    SS_RETURN_IF_ERROR(
        GatherMasks(*out[i], 0, slices[i].rows, slices[i].row0, &masks));
  }
  SS_RETURN_IF_ERROR(ApplyMasks(masks));
  const int64_t H = config_.hidden_size, V = config_.vocab_size;
  kernels::Backend& be = *backend_;
  Workspace& ws = *ws_;
  std::vector<int32_t> flags(2 * total);  // [argmax total | finite total]
  SS_RETURN_IF_ERROR(be.CopyToHost(flags.data(), ws.argmax.data(),
                                   flags.size() * sizeof(int32_t)));
  for (int i = 0; i < B; ++i) {
    const Slice& s = slices[i];
    ForwardResult* r = out[i];
    r->rows = s.rows;
    if (r->want_logits) {
      r->logits.resize(static_cast<size_t>(s.rows) * V);
      SS_RETURN_IF_ERROR(be.CopyToHost(r->logits.data(),
                                       ws.logits.f32() + s.row0 * V,
                                       s.rows * V * sizeof(float)));
    }
    r->hidden.resize(static_cast<size_t>(s.rows) * H);
    SS_RETURN_IF_ERROR(be.CopyToHost(r->hidden.data(),
                                     ws.hidden.f32() + s.row0 * H,
                                     s.rows * H * sizeof(float)));
    r->argmax.assign(flags.begin() + s.row0, flags.begin() + s.row0 + s.rows);
    r->finite.assign(flags.begin() + total + s.row0,
                     flags.begin() + total + s.row0 + s.rows);
  }
  return absl::OkStatus();
}

}  // namespace specserve::model
