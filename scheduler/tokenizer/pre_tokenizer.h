// Pre-tokenization: splits normalized text into the pieces ("words") the BPE
// model encodes one by one. Supports HF's Split (regex or literal pattern,
// every split behavior, invert) and ByteLevel (add_prefix_space, use_regex with
// the GPT-2 pattern), chained as in a Sequence. Regexes run on PCRE2 (UTF +
// UCP, JIT); `\s` and `\S` are rewritten to the Unicode White_Space property so
// that they mean what they mean in Oniguruma, which HF uses.
//
// Thread-safe: a built PreTokenizer is immutable; Split() keeps per-thread
// PCRE2 scratch space.
#ifndef SPECSERVE_SCHEDULER_TOKENIZER_PRE_TOKENIZER_H_
#define SPECSERVE_SCHEDULER_TOKENIZER_PRE_TOKENIZER_H_

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace specserve::tokenizer {

enum class SplitBehavior {
  kRemoved,
  kIsolated,
  kMergedWithPrevious,
  kMergedWithNext,
  kContiguous,
};

// A compiled PCRE2 pattern that lists its non-overlapping matches.
class Regex {
 public:
  // `literal` matches the pattern text as a plain string.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(
      std::string_view pattern, bool literal);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends [start, end) byte offsets of the matches in `text` (valid UTF-8),
  // left to right, as Oniguruma's find_iter reports them (an empty match
  // advances by one character).
  void FindAll(std::string_view text,
               std::vector<std::pair<size_t, size_t>>* out) const;

 private:
  explicit Regex(void* code) : code_(code) {}
  void* code_;  // pcre2_code*
};

// Rewrites `\s` / `\S` in an Oniguruma pattern to `\p{White_Space}` /
// `\P{White_Space}` (PCRE2's `\s` also matches U+180E, Oniguruma's does not).
std::string RewriteWhitespaceClasses(std::string_view pattern);

struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel };
  Kind kind;
  // kSplit:
  std::string pattern;
  bool literal = false;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  // kByteLevel:
  bool add_prefix_space = false;
  bool use_regex = true;
};

// Owned strings that pieces may point into (pieces made by add_prefix_space).
using PieceArena = std::deque<std::string>;

class PreTokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> Create(
      const std::vector<PreTokenizerStep>& steps);

  // Splits `text` (valid UTF-8) and appends the non-empty pieces to `pieces`.
  // Pieces point into `text` or into `arena`.
  void Split(std::string_view text, PieceArena* arena,
             std::vector<std::string_view>* pieces) const;

 private:
  struct Step {
    PreTokenizerStep spec;
    std::unique_ptr<Regex> regex;  // null for ByteLevel without use_regex
  };
  PreTokenizer() = default;
  void ApplySplit(const Step& step, std::string_view piece,
                  std::vector<std::string_view>* out) const;
  std::vector<Step> steps_;
};

}  // namespace specserve::tokenizer

#endif  // SPECSERVE_SCHEDULER_TOKENIZER_PRE_TOKENIZER_H_
