// What the client sees of a request's committed tokens: stop tokens end the
// output (shown as an id only when asked, never as text), stop strings cut
// the text (not looked for in the text of the first min_tokens tokens),
// text is streamed as complete UTF-8 only. Tokens past a stop are still
// committed in the session (the worker stops at round boundaries) but never
// shown. What ended the output (a stop token or a stop string) is kept for
// the final event.
#ifndef SPECSERVE_SCHEDULER_OUTPUT_STREAM_H_
#define SPECSERVE_SCHEDULER_OUTPUT_STREAM_H_

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/specserve.pb.h"
#include "scheduler/stop_strings.h"
#include "scheduler/tokenizer/streaming_detokenizer.h"
#include "scheduler/tokenizer/tokenizer.h"

namespace specserve::scheduler {

struct OutputOptions {
  bool want_text = false;
  bool want_ids = false;
  // Token ids that end the output (EOS unless ignored, stop_token_ids).
  std::set<uint32_t> stop_ids;
  std::vector<std::string> stop_strings;
  // Stop strings are looked for in the text of the tokens after these.
  uint32_t min_tokens = 0;
  // Show the stop token that ends the output: its id (with want_ids) and
  // logprobs, counted in shown_tokens(); never its text.
  bool show_stop_token = false;
};

class OutputStream {
 public:
  // `tokenizer` may be null when `want_text` is false and there are no stop
  // strings. Stop strings are matched on the decoded text whether or not
  // the text is sent (`want_text`).
  OutputStream(const tokenizer::Tokenizer* tokenizer, OutputOptions options);

  // Feeds newly committed tokens; returns the delta to send (possibly empty).
  // `logprobs` (nullable; else one per token): each shown token's entry
  // goes into the delta with it, so delta.logprobs stays aligned with the
  // tokens shown, whether or not their ids are sent.
  absl::StatusOr<specserve::v1::TokenDelta> Feed(
      const std::vector<uint32_t>& tokens,
      const google::protobuf::RepeatedPtrField<specserve::v1::TokenLogprobs>*
          logprobs = nullptr);
  // The held-back text at the end of a request that did not stop.
  specserve::v1::TokenDelta Finish();

  bool stopped() const { return stopped_; }
  // Tokens shown to the client (the completion).
  uint32_t shown_tokens() const { return shown_; }
  // What stopped the output: a stop token, or a stop string. Neither when
  // it did not stop.
  const std::optional<uint32_t>& matched_token() const {
    return matched_token_;
  }
  const std::optional<std::string>& matched_string() const {
    return matched_string_;
  }

 private:
  const OutputOptions options_;
  const bool want_text_;
  // Text is decoded: to send it, or to match stop strings in it.
  const bool decode_;
  std::unique_ptr<tokenizer::StreamingDetokenizer> detok_;
  StopStringMatcher stops_;
  bool stopped_ = false;
  uint32_t shown_ = 0;
  std::optional<uint32_t> matched_token_;
  std::optional<std::string> matched_string_;
};

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_OUTPUT_STREAM_H_
