#include "scheduler/tokenizer/unicode.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "glog/logging.h"
#include "scheduler/tokenizer/unicode_tables.h"

namespace specserve::tokenizer {
namespace {

namespace tables = unicode_tables;

constexpr uint32_t kReplacement = 0xFFFD;
constexpr char kReplacementUtf8[] = "\xEF\xBF\xBD";

// Hangul syllable arithmetic (Unicode 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161,
                   kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr uint32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

// For a lead byte: the length of its sequence and the allowed range of the
// second byte; len 0 marks a byte that can never start a character.
struct Lead {
  uint8_t len, lo, hi;
};

Lead LeadOf(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Length of the maximal valid prefix of the sequence at s[i] (1..lead.len), and
// whether it is a whole character. Bytes past the end count as "not yet seen".
struct Scan {
  size_t len;
  bool complete;
  bool truncated;  // stopped by the end of input, not by a bad byte
};

Scan ScanAt(std::string_view s, size_t i) {
  const Lead lead = LeadOf(static_cast<uint8_t>(s[i]));
  if (lead.len == 0) return {1, false, false};
  if (lead.len == 1) return {1, true, false};
  size_t k = 1;
  for (; k < lead.len; ++k) {
    if (i + k >= s.size()) return {k, false, true};
    const uint8_t b = static_cast<uint8_t>(s[i + k]);
    const uint8_t lo = k == 1 ? lead.lo : 0x80;
    const uint8_t hi = k == 1 ? lead.hi : 0xBF;
    if (b < lo || b > hi) return {k, false, false};
  }
  return {k, true, false};
}

bool InRanges(const tables::CpRange* begin, const tables::CpRange* end,
              uint32_t cp) {
  const tables::CpRange* it = std::upper_bound(
      begin, end, cp,
      [](uint32_t c, const tables::CpRange& r) { return c < r.first; });
  return it != begin && cp <= (it - 1)->last;
}

void Decompose(std::string_view s, std::vector<uint32_t>* out) {
  size_t pos = 0;
  while (pos < s.size()) {
    const uint32_t cp = DecodeUtf8(s, &pos);
    if (cp >= kSBase && cp < kSBase + kSCount) {
      const uint32_t index = cp - kSBase;
      out->push_back(kLBase + index / kNCount);
      out->push_back(kVBase + (index % kNCount) / kTCount);
      if (index % kTCount != 0) out->push_back(kTBase + index % kTCount);
      continue;
    }
    const auto* end = std::end(tables::kDecomp);
    const auto* it = std::lower_bound(
        std::begin(tables::kDecomp), end, cp,
        [](const tables::Decomp& d, uint32_t c) { return d.cp < c; });
    if (it != end && it->cp == cp) {
      out->insert(out->end(), tables::kDecompData + it->offset,
                  tables::kDecompData + it->offset + it->len);
    } else {
      out->push_back(cp);
    }
  }
  // Canonical ordering: stable sort of each run of non-starters by class.
  const size_t n = out->size();
  for (size_t i = 0; i < n;) {
    if (CombiningClass((*out)[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < n && CombiningClass((*out)[j]) != 0) ++j;
    if (j - i > 1) {
      std::stable_sort(out->begin() + i, out->begin() + j,
                       [](uint32_t a, uint32_t b) {
                         return CombiningClass(a) < CombiningClass(b);
                       });
    }
    i = j;
  }
}

// The primary composite of (a, b), or 0.
uint32_t ComposePair(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase &&
      b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 &&
      b > kTBase && b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const uint64_t key = (static_cast<uint64_t>(a) << 32) | b;
  const auto* end = std::end(tables::kCompose);
  const auto* it = std::lower_bound(
      std::begin(tables::kCompose), end, key,
      [](const tables::Compose& c, uint64_t k) { return c.key < k; });
  return (it != end && it->key == key) ? it->composite : 0;
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const Scan scan = ScanAt(s, i);
    if (!scan.complete) return false;
    i += scan.len;
  }
  return true;
}

size_t AppendUtf8Lossy(std::string_view s, bool flush, std::string* out) {
  size_t i = 0, run = 0;  // s[run, i) is valid and not yet copied
  const size_t n = s.size();
  while (i < n) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const Scan scan = ScanAt(s, i);
    if (scan.complete) {
      i += scan.len;
      continue;
    }
    out->append(s.data() + run, i - run);
    if (scan.truncated && !flush) return i;
    out->append(kReplacementUtf8);
    i += scan.len;
    run = i;
  }
  out->append(s.data() + run, n - run);
  return n;
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  AppendUtf8Lossy(bytes, /*flush=*/true, &out);
  return out;
}

uint32_t DecodeUtf8(std::string_view s, size_t* pos) {
  const uint8_t b0 = static_cast<uint8_t>(s[*pos]);
  if (b0 < 0x80) {
    ++*pos;
    return b0;
  }
  const size_t len = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
  DCHECK_LE(*pos + len, s.size()) << "DecodeUtf8 needs valid UTF-8";
  uint32_t cp = b0 & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) {
    cp = (cp << 6) | (static_cast<uint8_t>(s[*pos + k]) & 0x3F);
  }
  *pos += len;
  return cp;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint8_t CombiningClass(uint32_t cp) {
  if (cp < 0x300) return 0;
  const auto* begin = std::begin(tables::kCcc);
  const auto* end = std::end(tables::kCcc);
  const auto* it = std::upper_bound(
      begin, end, cp,
      [](uint32_t c, const tables::CccRange& r) { return c < r.first; });
  if (it == begin || cp > (it - 1)->last) return 0;
  return (it - 1)->ccc;
}

bool IsNfcQuick(std::string_view s) {
  // Every code point below U+0300 is NFC-stable with class 0: their UTF-8 lead
  // bytes are < 0xCC, so most text is settled without decoding.
  size_t pos = 0;
  while (pos < s.size()) {
    if (static_cast<uint8_t>(s[pos]) < 0xCC) {
      ++pos;
      continue;
    }
    const uint32_t cp = DecodeUtf8(s, &pos);
    if (InRanges(std::begin(tables::kNfcUnsafe), std::end(tables::kNfcUnsafe),
                 cp)) {
      return false;
    }
  }
  return true;
}

std::string ToNfd(std::string_view s) {
  std::vector<uint32_t> cps;
  cps.reserve(s.size());
  Decompose(s, &cps);
  std::string out;
  out.reserve(s.size() + s.size() / 2);
  for (uint32_t cp : cps) AppendUtf8(cp, &out);
  return out;
}

std::string ToNfc(std::string_view s) {
  std::vector<uint32_t> cps;
  cps.reserve(s.size());
  Decompose(s, &cps);
  // Canonical composition (Unicode 3.11, D117): each character composes with
  // the last starter unless a character between them blocks it.
  std::vector<uint32_t> out;
  out.reserve(cps.size());
  size_t starter = SIZE_MAX;
  for (uint32_t cp : cps) {
    const uint8_t ccc = CombiningClass(cp);
    if (starter != SIZE_MAX) {
      const bool adjacent = out.size() == starter + 1;
      const uint8_t last_ccc = CombiningClass(out.back());
      if (adjacent || (last_ccc != 0 && last_ccc < ccc)) {
        const uint32_t composite = ComposePair(out[starter], cp);
        if (composite != 0) {
          out[starter] = composite;
          continue;
        }
      }
    }
    if (ccc == 0) starter = out.size();
    out.push_back(cp);
  }
  std::string result;
  result.reserve(s.size());
  for (uint32_t cp : out) AppendUtf8(cp, &result);
  return result;
}

bool IsWhiteSpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool IsWordChar(uint32_t cp) {
  if (cp < 0x80) {
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') ||
           (cp >= 'A' && cp <= 'Z') || cp == '_';
  }
  // Rare path (single_word added tokens next to non-ASCII text): ask PCRE2,
  // which knows the Alphabetic and Join_Control properties.
  static pcre2_code* const kWord = [] {
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(
        reinterpret_cast<PCRE2_SPTR>(
            "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]"),
        PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &error,
        &offset, nullptr);
    CHECK(code != nullptr) << "word-character class must compile";
    return code;
  }();
  std::string utf8;
  AppendUtf8(cp, &utf8);
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  const int rc = pcre2_match(kWord, reinterpret_cast<PCRE2_SPTR>(utf8.data()),
                             utf8.size(), 0, 0, md, nullptr);
  pcre2_match_data_free(md);
  return rc > 0;
}

}  // namespace specserve::tokenizer
