// libFuzzer target: the tokenizer (scheduler/tokenizer) with the default
// model's tokenizer.json, loaded once. Each input is used twice: as text for
// Encode, and as a sequence of token ids (little-endian 16-bit values taken
// modulo vocab_size + 8, so a few are outside the vocabulary) for Decode and
// the streaming detokenizer. Checked besides "no crash, no sanitizer report",
// only what the headers promise:
//  - Encode gives ids of the vocabulary (Decode accepts them), the same ids
//    twice (the BPE word cache changes nothing);
//  - with parse_special=false, Decode(Encode(text)) is the NFC form of the
//    text after invalid UTF-8 became U+FFFD (byte-level BPE is lossless for
//    a tokenizer whose only normalizer is NFC, whose 256 byte tokens are all
//    in the vocabulary and whose added tokens are all special: checked at
//    start-up, the round trip is skipped otherwise);
//  - text with no added token's content in it encodes the same with and
//    without parse_special;
//  - Decode refuses (INVALID_ARGUMENT) exactly the sequences with an id
//    outside the vocabulary, and its text is valid UTF-8;
//  - StreamingDetokenizer: Feed of an unknown id fails and changes nothing,
//    at most 3 bytes are held back, and every Feed + Finish concatenated is
//    Decode of the ids fed (streaming_detokenizer.h);
//  - unicode.h: AppendUtf8Lossy in two pieces == Utf8Lossy whole,
//    Utf8Lossy's output is valid UTF-8, IsNfcQuick(s) => ToNfc(s) == s, and
//    ToNfc is idempotent.
// SPECSERVE_FUZZ_TOKENIZER names another tokenizer.json (default
// models/default/tokenizer.json, from the repository root).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "glog/logging.h"
#include "scheduler/tokenizer/byte_level.h"
#include "scheduler/tokenizer/streaming_detokenizer.h"
#include "scheduler/tokenizer/tokenizer.h"
#include "scheduler/tokenizer/unicode.h"

namespace {

namespace tk = specserve::tokenizer;

#define FUZZ_CHECK(cond, ...)                                 \
  do {                                                        \
    if (!(cond)) {                                            \
      std::fprintf(stderr, "FUZZ_CHECK failed: %s: ", #cond); \
      std::fprintf(stderr, __VA_ARGS__);                      \
      std::fprintf(stderr, "\n");                             \
      std::abort();                                           \
    }                                                         \
  } while (0)

const tk::Tokenizer* g_tok = nullptr;
bool g_round_trip = false;                 // the NFC round trip holds
std::vector<std::string> g_added_content;  // every added token's content

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Hex(std::string_view s) {
  std::string out;
  char b[4];
  for (unsigned char c : s.substr(0, 64)) {
    std::snprintf(b, sizeof(b), "%02x", c);
    out += b;
  }
  if (s.size() > 64) out += "...";
  return out;
}

void CheckUnicode(std::string_view bytes) {
  const std::string whole = tk::Utf8Lossy(bytes);
  FUZZ_CHECK(tk::IsValidUtf8(whole), "Utf8Lossy gave invalid UTF-8");
  // Pieces: decode the first half without flushing, then the rest with the
  // held-back tail in front.
  std::string pieces;
  const size_t cut = bytes.size() / 2;
  const size_t used = tk::AppendUtf8Lossy(bytes.substr(0, cut), false, &pieces);
  FUZZ_CHECK(used <= cut && cut - used <= 3, "AppendUtf8Lossy held back %zu",
             cut - used);
  std::string rest(bytes.substr(used));
  tk::AppendUtf8Lossy(rest, true, &pieces);
  FUZZ_CHECK(pieces == whole, "Utf8Lossy in pieces differs: %s",
             Hex(bytes).c_str());
  const std::string nfc = tk::ToNfc(whole);
  FUZZ_CHECK(tk::IsValidUtf8(nfc), "ToNfc gave invalid UTF-8");
  if (tk::IsNfcQuick(whole)) {
    FUZZ_CHECK(nfc == whole, "IsNfcQuick but ToNfc changes %s",
               Hex(whole).c_str());
  }
  FUZZ_CHECK(tk::ToNfc(nfc) == nfc, "ToNfc not idempotent on %s",
             Hex(whole).c_str());
}

void CheckEncode(std::string_view text) {
  const tk::Tokenizer& tok = *g_tok;
  const std::vector<uint32_t> ids = tok.Encode(text);
  FUZZ_CHECK(ids == tok.Encode(text), "Encode differs the second time");
  for (uint32_t id : ids) {
    FUZZ_CHECK(tok.IdToToken(id).has_value(), "Encode gave unknown id %u", id);
  }
  FUZZ_CHECK(tok.Decode(ids).ok(), "Decode refuses Encode's ids");

  const std::vector<uint32_t> plain = tok.Encode(text, /*parse_special=*/false);
  const std::string repaired = tk::Utf8Lossy(text);
  bool has_added = false;
  for (const std::string& c : g_added_content) {
    has_added = has_added || repaired.find(c) != std::string::npos;
  }
  if (!has_added) {
    FUZZ_CHECK(ids == plain, "parse_special matters without added tokens: %s",
               Hex(text).c_str());
  }
  if (g_round_trip) {
    auto decoded = tok.Decode(plain);
    FUZZ_CHECK(decoded.ok(), "%s", decoded.status().ToString().c_str());
    FUZZ_CHECK(*decoded == tk::ToNfc(repaired),
               "Decode(Encode(text)) != NFC(text) for %s: got %s",
               Hex(text).c_str(), Hex(*decoded).c_str());
  }
}

void CheckDecode(const uint8_t* data, size_t size) {
  const tk::Tokenizer& tok = *g_tok;
  if (size < 1) return;
  const bool skip_special = data[0] & 1;
  std::vector<uint32_t> ids, known;
  for (size_t i = 1; i + 1 < size; i += 2) {
    const uint32_t v = data[i] | (uint32_t{data[i + 1]} << 8);
    ids.push_back(v % (tok.vocab_size() + 8));
  }
  bool all_known = true;
  for (uint32_t id : ids) {
    const bool k = tok.IdToToken(id).has_value();
    all_known = all_known && k;
    if (k) known.push_back(id);
  }
  auto all = tok.Decode(ids, skip_special);
  if (all_known) {
    FUZZ_CHECK(all.ok(), "%s", all.status().ToString().c_str());
    FUZZ_CHECK(tk::IsValidUtf8(*all), "Decode gave invalid UTF-8");
  } else {
    FUZZ_CHECK(all.status().code() == absl::StatusCode::kInvalidArgument,
               "Decode with an unknown id: %s",
               all.status().ToString().c_str());
  }

  tk::StreamingDetokenizer stream(&tok, skip_special);
  std::string streamed;
  for (uint32_t id : ids) {
    const size_t pending = stream.pending_bytes();
    auto piece = stream.Feed(id);
    if (!piece.ok()) {
      FUZZ_CHECK(!tok.IdToToken(id).has_value(), "Feed refused known id %u",
                 id);
      FUZZ_CHECK(stream.pending_bytes() == pending,
                 "a refused Feed changed the state");
      continue;
    }
    FUZZ_CHECK(tk::IsValidUtf8(*piece), "Feed gave invalid UTF-8");
    FUZZ_CHECK(stream.pending_bytes() <= 3, "%zu bytes held back",
               stream.pending_bytes());
    streamed += *piece;
  }
  streamed += stream.Finish();
  FUZZ_CHECK(stream.pending_bytes() == 0, "Finish kept bytes");
  auto want = tok.Decode(known, skip_special);
  FUZZ_CHECK(want.ok(), "%s", want.status().ToString().c_str());
  FUZZ_CHECK(streamed == *want, "streamed %s != Decode %s",
             Hex(streamed).c_str(), Hex(*want).c_str());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 2;  // ERROR and up
  const char* env = std::getenv("SPECSERVE_FUZZ_TOKENIZER");
  const std::string path = env ? env : "models/default/tokenizer.json";
  auto tok = tk::Tokenizer::Load(path);
  if (!tok.ok()) {
    std::fprintf(stderr, "tokenizer_fuzzer: cannot load %s: %s\n", path.c_str(),
                 tok.status().ToString().c_str());
    std::exit(1);
  }
  g_tok = tok->release();  // lives for the process

  // Whether Decode(Encode(text, false)) == NFC(text) is promised here.
  auto spec = tk::ParseTokenizerJson(ReadAll(path));
  FUZZ_CHECK(spec.ok(), "%s", spec.status().ToString().c_str());
  bool special_only = true;
  for (const tk::AddedToken& t : spec->added_tokens) {
    special_only = special_only && t.special && !t.normalized;
    g_added_content.push_back(t.content);
  }
  bool all_bytes = true;
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    all_bytes = all_bytes && g_tok->TokenToId(tk::BytesToByteLevel(one));
  }
  g_round_trip = special_only && all_bytes && spec->normalizers.size() == 1 &&
                 spec->normalizers[0] == tk::NormalizerKind::kNfc;
  std::fprintf(stderr, "tokenizer_fuzzer: %s, vocab %u, round-trip check %s\n",
               path.c_str(), g_tok->vocab_size(), g_round_trip ? "on" : "off");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  CheckUnicode(bytes);
  CheckEncode(bytes);
  CheckDecode(data, size);
  return 0;
}
