// What a burst applies on the host to every row that chooses a token: vLLM's
// logit controls (kernels/sampling/logit_adjust.h) and the request's grammar
// (worker/grammar/grammar_cursor.h), both at the row's own place in the
// history. The engine pushes each token it tries (a draft, a verify column's
// prefix, an emitted token) and pops back to where a round started, so the
// controls see exactly the prefix a plain step at that position would: that
// keeps speculative == plain under penalties and grammars alike.
#ifndef SPECSERVE_WORKER_SPEC_ROW_CONTROLS_H_
#define SPECSERVE_WORKER_SPEC_ROW_CONTROLS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/sampling/logit_adjust.h"
#include "worker/grammar/grammar_cursor.h"

namespace specserve::spec {

class RowControls {
 public:
  // `adjust` is applied when active(); `cursor` (may be null) is the
  // session's grammar position, at the same length as the history behind
  // `history` (CHECKed). The history's last `output_len` tokens are the
  // request's output so far.
  RowControls(const sampling::LogitAdjustments& adjust,
              absl::Span<const int32_t> history, int64_t output_len,
              grammar::GrammarCursor* cursor);

  // History index of the next token.
  int64_t length() const { return counts_.length(); }
  void Push(int32_t token);
  // Back to length() == `length` (at least the request's prompt length).
  void PopTo(int64_t length);

  // Adjusts `row` ([vocab], the logits that choose the token at length())
  // in place: the logit controls, then the grammar's mask (disallowed
  // tokens -inf). When min_tokens' mask and the grammar leave no token
  // (the grammar allows only a stop token), the grammar wins: the row is
  // the grammar-masked raw logits. OUT_OF_RANGE on a grammar dead end.
  absl::Status Apply(absl::Span<float> row);

  // For a row masked on the backend instead (a grammar and no logit
  // controls: ForwardResult::mask_rows): appends the grammar's mask for the
  // token at length() to `words` (kernels/token_mask.h's layout) and
  // returns true, or appends nothing and returns false when the grammar
  // does not constrain that token (off it, or after its end). OUT_OF_RANGE
  // on a grammar dead end, as Apply.
  absl::StatusOr<bool> AppendMask(std::vector<uint32_t>* words);

  // The grammar accepted its stop token: the output is complete.
  bool grammar_done() const {
    return cursor_ != nullptr && cursor_->terminated();
  }

 private:
  const sampling::LogitAdjustments& adjust_;
  sampling::TokenCounts counts_;
  grammar::GrammarCursor* const cursor_;
  std::vector<int32_t> bitmask_;
  std::vector<float> raw_;
};

}  // namespace specserve::spec

#endif  // SPECSERVE_WORKER_SPEC_ROW_CONTROLS_H_
