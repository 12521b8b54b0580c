#include "scheduler/tokenizer/byte_level.h"

#include <array>

#include "scheduler/tokenizer/unicode.h"

namespace specserve::tokenizer {
namespace {

// Printable Latin-1 bytes map to themselves; the others, in byte order, to
// U+0100, U+0101, ...
struct Tables {
  std::array<uint32_t, 256> to_cp;
  std::array<int16_t, 0x144> to_byte;  // code point -> byte, or -1

  Tables() {
    to_byte.fill(-1);
    uint32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') ||
                             (b >= 0xA1 && b <= 0xAC) ||
                             (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? b : next++;
      to_byte[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const Tables& GetTables() {
  static const Tables* const kTables = new Tables();
  return *kTables;
}

}  // namespace

uint32_t ByteToCodePoint(uint8_t b) { return GetTables().to_cp[b]; }

std::string BytesToByteLevel(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes)
    AppendUtf8(ByteToCodePoint(static_cast<uint8_t>(c)), &out);
  return out;
}

bool ByteLevelToBytes(std::string_view token, std::string* out) {
  const Tables& t = GetTables();
  const size_t old_size = out->size();
  size_t pos = 0;
  while (pos < token.size()) {
    const uint32_t cp = DecodeUtf8(token, &pos);
    if (cp >= t.to_byte.size() || t.to_byte[cp] < 0) {
      out->resize(old_size);
      return false;
    }
    out->push_back(static_cast<char>(t.to_byte[cp]));
  }
  return true;
}

}  // namespace specserve::tokenizer
