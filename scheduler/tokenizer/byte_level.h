// The GPT-2 "byte-level" alphabet: a bijection between the 256 byte values and
// 256 printable code points, used by HF ByteLevel pre-tokenizers and decoders.
// Vocabulary entries of byte-level BPE models are strings over this alphabet.
#ifndef SPECSERVE_SCHEDULER_TOKENIZER_BYTE_LEVEL_H_
#define SPECSERVE_SCHEDULER_TOKENIZER_BYTE_LEVEL_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace specserve::tokenizer {

// The code point that stands for byte `b`.
uint32_t ByteToCodePoint(uint8_t b);

// The byte-level string of raw bytes (each byte -> its code point, UTF-8
// encoded).
std::string BytesToByteLevel(std::string_view bytes);

// If every character of `token` (valid UTF-8) is in the byte-level alphabet,
// appends the bytes they stand for to `out` and returns true; otherwise leaves
// `out` as it was and returns false.
bool ByteLevelToBytes(std::string_view token, std::string* out);

}  // namespace specserve::tokenizer

#endif  // SPECSERVE_SCHEDULER_TOKENIZER_BYTE_LEVEL_H_
