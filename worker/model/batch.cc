// Model::DecodeBatch: one token for each of several sessions in one trunk
// pass. The rows are one Model::Slice per session, so the matmuls and norms
// run once over the batch and the cache ops once per session (blocks.cc);
// row-invariant kernels make every row bit-identical to Decode alone.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "telemetry/status_macros.h"
#include "worker/model/model.h"

namespace specserve::model {

absl::Status Model::DecodeBatch(absl::Span<ModelState* const> states,
                                absl::Span<const int32_t> tokens,
                                ForwardResult* out) {
  const int n = static_cast<int>(states.size());
  if (n < 1 || n > kMaxRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode batch: ", n, " sessions (1..", kMaxRows, ")"));
  }
  if (tokens.size() != states.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "decode batch: ", n, " sessions and ", tokens.size(), " tokens"));
  }
  SS_RETURN_IF_ERROR(CheckTokens(tokens));
  for (int i = 0; i < n; ++i) {
    SS_RETURN_IF_ERROR(CheckBatchMember(states, i, "decode batch", false));
    const ModelState* s = states[i];
    if (s->verified_columns_ != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("decode batch: session ", i,
                       ": a verify is pending (commit or discard it first)"));
    }
    if (s->length_ + 1 > s->capacity_) {
      return absl::OutOfRangeError(
          absl::StrCat("decode batch: session ", i, ": ", s->length_,
                       " committed rows fill capacity ", s->capacity_));
    }
  }
  out->Clear(/*position=*/-1);
  return DecodeStep(states, tokens, out);
}

absl::Status Model::CheckBatchMember(absl::Span<ModelState* const> states,
                                     int i, const char* what, bool drafts) {
  const ModelState* s = states[i];
  if (s == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": session ", i, " is null"));
  }
  if (std::find(states.begin(), states.begin() + i, s) != states.begin() + i) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": session ", i, " appears twice"));
  }
  if (s->offloaded_) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": session ", i, ": session caches are offloaded"));
  }
  if (drafts && s->draft_freed_) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": session ", i, ": the draft state was freed (FreeDraftState)"));
  }
  return absl::OkStatus();
}

}  // namespace specserve::model
