// Added tokens (special tokens like <|im_end|> and user-added tokens): found in
// the text before pre-tokenization, with HF tokenizers' rules: leftmost-longest
// matching, `single_word` (no word character on either side), `lstrip` /
// `rstrip` (absorb the whitespace before / after), and `special` (not matched
// when parse_special is off).
//
// Immutable after construction; thread-safe.
#ifndef SPECSERVE_SCHEDULER_TOKENIZER_ADDED_TOKENS_H_
#define SPECSERVE_SCHEDULER_TOKENIZER_ADDED_TOKENS_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace specserve::tokenizer {

struct AddedToken {
  std::string content;
  uint32_t id = 0;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  // Matched against normalized text (with its content normalized) instead of
  // the raw input.
  bool normalized = true;
};

// One part of a split: [start, end) of the text, and the added token it is, if
// any.
struct AddedSplit {
  size_t start;
  size_t end;
  const AddedToken* token;  // null: ordinary text
};

class AddedTokenMatcher {
 public:
  // `patterns[i]` is the text that stands for `*tokens[i]` (its content,
  // normalized when the token is). Tokens must outlive the matcher. Empty
  // patterns are ignored.
  AddedTokenMatcher(std::vector<std::string> patterns,
                    std::vector<const AddedToken*> tokens);

  bool empty() const { return entries_.empty(); }

  // Splits `text` into ordinary parts and added tokens (HF AddedVocabulary's
  // find_matches). Parts may be empty only when `text` is.
  void Split(std::string_view text, bool parse_special,
             std::vector<AddedSplit>* out) const;

 private:
  struct Entry {
    std::string pattern;
    const AddedToken* token;
  };
  // Leftmost-longest match starting at or after `from`; false if none.
  bool FindNext(std::string_view text, size_t from, size_t* start,
                const Entry** entry) const;

  std::vector<Entry> entries_;  // by first byte, then longest first
  // first_[b] .. first_[b+1]: the entries whose pattern starts with byte b.
  std::array<uint32_t, 257> first_{};
};

}  // namespace specserve::tokenizer

#endif  // SPECSERVE_SCHEDULER_TOKENIZER_ADDED_TOKENS_H_
