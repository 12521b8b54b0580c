// Incremental decoding for streamed generation: feed token ids one at a time
// and get back only text that is complete, valid UTF-8. Bytes of a character
// split across tokens are held back until the character is complete (or proven
// invalid, which then becomes U+FFFD, exactly where Tokenizer::Decode puts
// one).
//
// Invariant: the concatenation of every Feed() result and Finish() equals
// Tokenizer::Decode(all ids fed, skip_special) for every sequence of ids.
//
// One detokenizer per stream; not thread-safe itself (the Tokenizer it uses
// is).
#ifndef SPECSERVE_SCHEDULER_TOKENIZER_STREAMING_DETOKENIZER_H_
#define SPECSERVE_SCHEDULER_TOKENIZER_STREAMING_DETOKENIZER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "scheduler/tokenizer/tokenizer.h"

namespace specserve::tokenizer {

class StreamingDetokenizer {
 public:
  // `tokenizer` must outlive this object.
  explicit StreamingDetokenizer(const Tokenizer* tokenizer,
                                bool skip_special = false)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}

  // Text made complete by `id` (often empty while a character is incomplete).
  // InvalidArgument for an id outside the vocabulary (the state is unchanged).
  absl::StatusOr<std::string> Feed(uint32_t id);

  // Flushes held-back bytes (an incomplete character becomes U+FFFD) and resets
  // the detokenizer for a new stream.
  std::string Finish();

  // Bytes held back, waiting for the rest of a character (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;  // a valid but incomplete UTF-8 prefix of one character
};

}  // namespace specserve::tokenizer

#endif  // SPECSERVE_SCHEDULER_TOKENIZER_STREAMING_DETOKENIZER_H_
