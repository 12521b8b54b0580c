// A Hugging Face tokenizer.json tokenizer for byte-level BPE models (the Qwen2
// / Qwen3 / Qwen3.5 family and GPT-2-style tokenizers), in C++.
//
//   SS_ASSIGN_OR_RETURN(auto tok, Tokenizer::Load("/models/x/tokenizer.json"));
//   std::vector<uint32_t> ids = tok->Encode("Hello <|im_end|>");
//   SS_ASSIGN_OR_RETURN(std::string text, tok->Decode(ids));
//
// Encode gives the ids HF `tokenizers` gives for `encode(text,
// add_special_tokens=False)`: added tokens are split out first, the rest is
// normalized (NFC/NFD), pre-tokenized (Split / ByteLevel) and BPE-encoded.
// Decode is HF's `decode` with the ByteLevel decoder. Load refuses any
// tokenizer.json feature it does not implement (with the offending field in the
// message) rather than encode differently from HF.
//
// If a tokenizer_config.json sits beside tokenizer.json, its eos/bos tokens and
// any added tokens that only it lists are taken in; a generation_config.json
// beside it adds its eos_token_id(s).
//
// All const methods are thread-safe (the BPE word cache is internally locked).
#ifndef SPECSERVE_SCHEDULER_TOKENIZER_TOKENIZER_H_
#define SPECSERVE_SCHEDULER_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "scheduler/tokenizer/added_tokens.h"
#include "scheduler/tokenizer/bpe.h"
#include "scheduler/tokenizer/pre_tokenizer.h"

namespace specserve::tokenizer {

enum class NormalizerKind { kNfc, kNfd };

// Everything Load reads from the files, already validated. Built by
// ParseTokenizerJson (tokenizer_json.cc); exposed for tests.
struct TokenizerSpec {
  std::vector<NormalizerKind> normalizers;      // applied in order
  std::vector<PreTokenizerStep> pre_tokenizer;  // ends with a ByteLevel step
  BpeConfig bpe;
  std::vector<AddedToken> added_tokens;
  std::vector<uint32_t> eos_token_ids;
  std::optional<uint32_t> bos_token_id;
};

// Parses tokenizer.json text (and, if non-empty, tokenizer_config.json and
// generation_config.json text) into a spec. InvalidArgument names the field at
// fault.
absl::StatusOr<TokenizerSpec> ParseTokenizerJson(
    std::string_view tokenizer_json,
    std::string_view tokenizer_config_json = "",
    std::string_view generation_config_json = "");

class Tokenizer {
 public:
  // Reads `path` (a tokenizer.json) and the optional config files beside it.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(
      const std::string& path);
  // Builds a tokenizer from an already parsed spec.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromSpec(
      TokenizerSpec spec);

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`. With parse_special=false special tokens written in the
  // text are encoded as plain text (HF `encode_special_tokens=True`);
  // non-special added tokens still match. Invalid UTF-8 in `text` is first
  // replaced by U+FFFD.
  std::vector<uint32_t> Encode(std::string_view text,
                               bool parse_special = true) const;

  // Text of `ids` (invalid UTF-8 from partial byte sequences becomes U+FFFD, as
  // in HF). InvalidArgument if an id is not in the vocabulary.
  absl::StatusOr<std::string> Decode(absl::Span<const uint32_t> ids,
                                     bool skip_special = false) const;

  // Appends the raw bytes `ids` decode to, before UTF-8 repair (what the
  // streaming detokenizer works on).
  absl::Status DecodeBytes(absl::Span<const uint32_t> ids, bool skip_special,
                           std::string* out) const;

  // One past the largest id (vocabulary plus added tokens). Ids below it that
  // belong to no token (holes) are rejected by Decode.
  uint32_t vocab_size() const { return static_cast<uint32_t>(tokens_.size()); }
  std::optional<uint32_t> TokenToId(std::string_view token) const;
  // The token's string as stored in tokenizer.json (byte-level form for BPE
  // tokens; for added tokens with normalized=true, the normalized content, as
  // HF).
  std::optional<std::string> IdToToken(uint32_t id) const;
  const std::vector<uint32_t>& eos_token_ids() const { return eos_token_ids_; }
  std::optional<uint32_t> bos_token_id() const { return bos_token_id_; }
  bool IsSpecial(uint32_t id) const {
    return id < tokens_.size() && tokens_[id].special;
  }

 private:
  struct TokenInfo {
    std::string text;   // what IdToToken returns
    std::string bytes;  // what the ByteLevel decoder makes of it
    bool present = false;
    bool special = false;
  };

  Tokenizer() = default;
  // Normalizes, pre-tokenizes and BPE-encodes text that holds no raw added
  // token.
  void EncodeOrdinary(std::string_view text, bool parse_special,
                      std::vector<uint32_t>* ids) const;
  std::string Normalize(std::string_view text) const;

  std::vector<NormalizerKind> normalizers_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> bpe_;
  std::vector<AddedToken> added_tokens_;
  // Added tokens matched on the raw input / on normalized text.
  std::unique_ptr<AddedTokenMatcher> raw_matcher_;
  std::unique_ptr<AddedTokenMatcher> normalized_matcher_;
  std::vector<TokenInfo> tokens_;  // by id
  absl::flat_hash_map<std::string, uint32_t> token_to_id_;
  std::vector<uint32_t> eos_token_ids_;
  std::optional<uint32_t> bos_token_id_;
};

}  // namespace specserve::tokenizer

#endif  // SPECSERVE_SCHEDULER_TOKENIZER_TOKENIZER_H_
