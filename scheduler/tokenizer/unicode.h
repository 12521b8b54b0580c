// UTF-8 and Unicode helpers for the tokenizer: validation, lossy decoding that
// matches Rust's String::from_utf8_lossy (what HF tokenizers' ByteLevel decoder
// uses), and NFC/NFD normalization from the generated tables in
// unicode_tables.h.
//
// All functions are pure and thread-safe. Functions taking "valid UTF-8"
// require it (callers validate once with IsValidUtf8 and repair with
// Utf8Lossy).
#ifndef SPECSERVE_SCHEDULER_TOKENIZER_UNICODE_H_
#define SPECSERVE_SCHEDULER_TOKENIZER_UNICODE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace specserve::tokenizer {

// True iff `s` is well-formed UTF-8 (no surrogates, no overlongs, <= U+10FFFF).
bool IsValidUtf8(std::string_view s);

// Appends the lossy decoding of `bytes` to `out`: each maximal invalid subpart
// becomes U+FFFD (the Unicode "substitution of maximal subparts" practice, as
// Rust does). With flush=false a trailing sequence that is a valid but
// incomplete prefix of a character is left undecoded. Returns the number of
// bytes consumed; the rest (at most 3 bytes) must be fed again with the bytes
// that follow it. Decoding a string in pieces this way gives exactly the output
// of decoding it whole.
size_t AppendUtf8Lossy(std::string_view bytes, bool flush, std::string* out);

// Lossy decoding of a whole byte string (flush=true).
std::string Utf8Lossy(std::string_view bytes);

// Decodes the code point starting at s[*pos] and advances *pos. `s` is valid
// UTF-8.
uint32_t DecodeUtf8(std::string_view s, size_t* pos);

// Appends the UTF-8 encoding of code point `cp` (a Unicode scalar value).
void AppendUtf8(uint32_t cp, std::string* out);

// Canonical combining class of `cp` (0 for starters).
uint8_t CombiningClass(uint32_t cp);

// True when `s` (valid UTF-8) is certainly in NFC: no character in it can
// change under NFC or combine with a neighbour. False means "normalize to find
// out".
bool IsNfcQuick(std::string_view s);

// Unicode normalization forms C and D of valid UTF-8 `s`.
std::string ToNfc(std::string_view s);
std::string ToNfd(std::string_view s);

// Unicode White_Space property (what Rust's regex `\s` matches).
bool IsWhiteSpace(uint32_t cp);

// Rust regex `\w`: Alphabetic, Mark, Decimal_Number, Connector_Punctuation or
// Join_Control.
bool IsWordChar(uint32_t cp);

}  // namespace specserve::tokenizer

#endif  // SPECSERVE_SCHEDULER_TOKENIZER_UNICODE_H_
