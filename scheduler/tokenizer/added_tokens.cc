#include "scheduler/tokenizer/added_tokens.h"

#include <algorithm>
#include <cstring>

#include "scheduler/tokenizer/unicode.h"

namespace specserve::tokenizer {
namespace {

// The code point that ends at text[end) (text is valid UTF-8, end > 0).
uint32_t LastCodePoint(std::string_view text, size_t end, size_t* start) {
  size_t pos = end - 1;
  while (pos > 0 && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80) --pos;
  *start = pos;
  size_t p = pos;
  return DecodeUtf8(text, &p);
}

bool EndsWithWord(std::string_view text, size_t end) {
  if (end == 0) return false;
  size_t start;
  return IsWordChar(LastCodePoint(text, end, &start));
}

bool StartsWithWord(std::string_view text, size_t start) {
  if (start >= text.size()) return false;
  return IsWordChar(DecodeUtf8(text, &start));
}

// Start of the whitespace run that ends at `end`.
size_t WhitespaceRunStart(std::string_view text, size_t end) {
  while (end > 0) {
    size_t start;
    if (!IsWhiteSpace(LastCodePoint(text, end, &start))) break;
    end = start;
  }
  return end;
}

// End of the whitespace run that starts at `start`.
size_t WhitespaceRunEnd(std::string_view text, size_t start) {
  while (start < text.size()) {
    size_t next = start;
    if (!IsWhiteSpace(DecodeUtf8(text, &next))) break;
    start = next;
  }
  return start;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<std::string> patterns,
                                     std::vector<const AddedToken*> tokens) {
  for (size_t i = 0; i < patterns.size(); ++i) {
    if (patterns[i].empty()) continue;
    entries_.push_back({std::move(patterns[i]), tokens[i]});
  }
  // Longest first within a first byte, so the first hit at a position is the
  // longest. Equal patterns keep their given order (the first one wins, as in
  // Aho-Corasick).
  std::stable_sort(entries_.begin(), entries_.end(),
                   [](const Entry& a, const Entry& b) {
                     const uint8_t fa = a.pattern[0], fb = b.pattern[0];
                     if (fa != fb) return fa < fb;
                     return a.pattern.size() > b.pattern.size();
                   });
  size_t e = 0;
  for (int b = 0; b < 256; ++b) {
    first_[b] = static_cast<uint32_t>(e);
    while (e < entries_.size() &&
           static_cast<uint8_t>(entries_[e].pattern[0]) == b) {
      ++e;
    }
  }
  first_[256] = static_cast<uint32_t>(e);
}

bool AddedTokenMatcher::FindNext(std::string_view text, size_t from,
                                 size_t* start, const Entry** entry) const {
  for (size_t pos = from; pos < text.size(); ++pos) {
    const uint8_t b = static_cast<uint8_t>(text[pos]);
    for (uint32_t i = first_[b]; i < first_[b + 1]; ++i) {
      const std::string& p = entries_[i].pattern;
      if (p.size() <= text.size() - pos &&
          std::memcmp(p.data(), text.data() + pos, p.size()) == 0) {
        *start = pos;
        *entry = &entries_[i];
        return true;
      }
    }
  }
  return false;
}

void AddedTokenMatcher::Split(std::string_view text, bool parse_special,
                              std::vector<AddedSplit>* out) const {
  if (text.empty()) {
    out->push_back({0, 0, nullptr});
    return;
  }
  size_t start_offset = 0;  // end of the last emitted split
  size_t search = 0;        // where the next match search begins
  size_t match_start;
  const Entry* entry;
  while (search < text.size() && FindNext(text, search, &match_start, &entry)) {
    size_t start = match_start;
    size_t stop = match_start + entry->pattern.size();
    // As in HF, the search resumes after the raw match, even when the match is
    // then discarded or its span grows by rstrip.
    search = stop;
    const AddedToken& token = *entry->token;
    if (!parse_special && token.special) continue;
    if (token.single_word &&
        (EndsWithWord(text, start) || StartsWithWord(text, stop))) {
      continue;
    }
    if (token.lstrip)
      start = std::max(WhitespaceRunStart(text, start), start_offset);
    if (token.rstrip) stop = WhitespaceRunEnd(text, stop);
    if (start_offset < start) out->push_back({start_offset, start, nullptr});
    out->push_back({start, stop, &token});
    start_offset = stop;
  }
  if (start_offset != text.size()) {
    out->push_back({start_offset, text.size(), nullptr});
  }
}

}  // namespace specserve::tokenizer
