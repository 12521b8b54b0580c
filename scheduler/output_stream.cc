#include "scheduler/output_stream.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "telemetry/status_macros.h"

namespace specserve::scheduler {

OutputStream::OutputStream(const tokenizer::Tokenizer* tokenizer,
                           bool want_text, bool want_ids,
                           std::set<uint32_t> stop_ids,
                           const std::vector<std::string>& stop_strings)
    : want_text_(want_text && tokenizer != nullptr),
      decode_((want_text || !stop_strings.empty()) && tokenizer != nullptr),
      want_ids_(want_ids),
      stop_ids_(std::move(stop_ids)),
      stops_(stop_strings) {
  if (decode_) {
    detok_ = std::make_unique<tokenizer::StreamingDetokenizer>(
        tokenizer, /*skip_special=*/true);
  }
}

absl::StatusOr<specserve::v1::TokenDelta> OutputStream::Feed(
    const std::vector<uint32_t>& tokens,
    const google::protobuf::RepeatedPtrField<specserve::v1::TokenLogprobs>*
        logprobs) {
  specserve::v1::TokenDelta delta;
  if (logprobs != nullptr &&
      logprobs->size() != static_cast<int>(tokens.size())) {
    return absl::InternalError(absl::StrCat("the worker sent ",
                                            logprobs->size(), " logprobs for ",
                                            tokens.size(), " tokens"));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    const uint32_t t = tokens[i];
    if (stopped_) break;
    if (stop_ids_.count(t)) {
      stopped_ = true;
      break;
    }
    if (want_ids_) delta.add_ids(t);
    if (logprobs != nullptr) *delta.add_logprobs() = (*logprobs)[i];
    ++shown_;
    if (decode_) {
      SS_ASSIGN_OR_RETURN(std::string piece, detok_->Feed(t));
      if (!stops_.empty()) {
        StopStringMatcher::Result r = stops_.Feed(piece);
        piece = std::move(r.emit);
        if (r.stopped) stopped_ = true;
      }
      if (want_text_) delta.mutable_text()->append(piece);
    }
  }
  return delta;
}

specserve::v1::TokenDelta OutputStream::Finish() {
  specserve::v1::TokenDelta delta;
  if (!want_text_ || stopped_) return delta;
  std::string tail = detok_->Finish();
  if (!stops_.empty()) {
    StopStringMatcher::Result r = stops_.Feed(tail);
    tail = std::move(r.emit);
    if (!r.stopped) tail += stops_.Flush();
  }
  delta.mutable_text()->append(tail);
  return delta;
}

}  // namespace specserve::scheduler
