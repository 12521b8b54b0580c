#include "scheduler/tokenizer/streaming_detokenizer.h"

#include "scheduler/tokenizer/unicode.h"
#include "telemetry/status_macros.h"

namespace specserve::tokenizer {

absl::StatusOr<std::string> StreamingDetokenizer::Feed(uint32_t id) {
  std::string bytes = pending_;
  SS_RETURN_IF_ERROR(tokenizer_->DecodeBytes({&id, 1}, skip_special_, &bytes));
  std::string text;
  // Lossy decoding stopped before an incomplete tail gives the same output as
  // decoding everything at once: the tail starts a fresh character either way.
  const size_t consumed = AppendUtf8Lossy(bytes, /*flush=*/false, &text);
  pending_ = bytes.substr(consumed);
  return text;
}

std::string StreamingDetokenizer::Finish() {
  std::string text;
  AppendUtf8Lossy(pending_, /*flush=*/true, &text);
  pending_.clear();
  return text;
}

}  // namespace specserve::tokenizer
