#include "scheduler/output_stream.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "telemetry/status_macros.h"

namespace specserve::scheduler {

OutputStream::OutputStream(const tokenizer::Tokenizer* tokenizer,
                           OutputOptions options)
    : options_(std::move(options)),
      want_text_(options_.want_text && tokenizer != nullptr),
      decode_((options_.want_text || !options_.stop_strings.empty()) &&
              tokenizer != nullptr),
      stops_(options_.stop_strings) {
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
    const bool stop_token = options_.stop_ids.count(t) > 0;
    if (stop_token && !options_.show_stop_token) {
      stopped_ = true;
      matched_token_ = t;
      break;
    }
    if (options_.want_ids) delta.add_ids(t);
    if (logprobs != nullptr) *delta.add_logprobs() = (*logprobs)[i];
    ++shown_;
    if (stop_token) {
      stopped_ = true;
      matched_token_ = t;
      break;
    }
    if (decode_) {
      SS_ASSIGN_OR_RETURN(std::string piece, detok_->Feed(t));
      // As vLLM: the text of the first min_tokens tokens cannot stop.
      if (!stops_.empty() && shown_ > options_.min_tokens) {
        StopStringMatcher::Result r = stops_.Feed(piece);
        piece = std::move(r.emit);
        if (r.stopped) {
          stopped_ = true;
          matched_string_ = std::move(r.matched);
        }
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
