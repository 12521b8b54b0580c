// A session's position in its request's grammar, along the token history
// (worker/spec's engine keeps one per constrained session between bursts).
//
// The output starts at history index output_start(); the cursor follows
// every token pushed after it. Every token the engine chooses is masked by
// the cursor, so the grammar refuses a pushed token only past the output's
// end (a stop token accepted) or in a round's draft chain past a refused
// column: the cursor is then off the grammar and follows tokens without a
// mask until they are popped.
#ifndef SPECSERVE_WORKER_GRAMMAR_GRAMMAR_CURSOR_H_
#define SPECSERVE_WORKER_GRAMMAR_GRAMMAR_CURSOR_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/grammar/grammar.h"

namespace specserve::grammar {

class GrammarCursor {
 public:
  // A cursor at the start of an output beginning at history index
  // `output_start`, for the grammar `grammar` known as `key` (what tells
  // one request's grammar from another's).
  static absl::StatusOr<GrammarCursor> Start(const CompiledGrammar& grammar,
                                             std::string key,
                                             int64_t output_start);

  const std::string& key() const { return key_; }
  int64_t output_start() const { return output_start_; }
  // History index of the next token.
  int64_t length() const { return output_start_ + pushed_; }
  int bitmask_words() const { return matcher_.bitmask_words(); }

  // Follows `token`: the grammar accepts it while the cursor is on it.
  void Push(int32_t token);
  // Drops tokens from the end until length() == `length`, which must lie
  // in [output_start(), length()] (CHECKed).
  void PopTo(int64_t length);

  // Whether the grammar constrains the next token: true with `bitmask`
  // (bitmask_words() words) holding the allowed tokens; false off the
  // grammar or after its end (no constraint). OUT_OF_RANGE naming the
  // position when no token is allowed before the end (a dead end: the
  // output cannot go on inside the grammar).
  absl::StatusOr<bool> FillMask(absl::Span<int32_t> bitmask);

  // On the grammar with its stop token accepted: the output is complete.
  bool terminated() const { return on_grammar() && matcher_.IsTerminated(); }

 private:
  GrammarCursor(GrammarMatcher matcher, std::string key, int64_t output_start)
      : matcher_(std::move(matcher)),
        key_(std::move(key)),
        output_start_(output_start) {}
  // The accepted tokens are a prefix of the pushed ones; the cursor is on
  // the grammar while they are all of them.
  bool on_grammar() const { return matcher_.num_accepted() == pushed_; }

  GrammarMatcher matcher_;
  std::string key_;
  int64_t output_start_;
  int64_t pushed_ = 0;
};

}  // namespace specserve::grammar

#endif  // SPECSERVE_WORKER_GRAMMAR_GRAMMAR_CURSOR_H_
