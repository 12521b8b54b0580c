#include "scheduler/tokenizer/tokenizer.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "scheduler/tokenizer/byte_level.h"
#include "scheduler/tokenizer/unicode.h"
#include "telemetry/status_macros.h"

namespace specserve::tokenizer {
namespace {

// Reads a whole file; NotFound if it does not exist and `optional` (then "").
absl::StatusOr<std::string> ReadFile(const std::string& path, bool optional) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (optional) return std::string();
    return absl::NotFoundError(absl::StrCat("cannot open ", path));
  }
  std::ostringstream data;
  data << in.rdbuf();
  if (in.bad())
    return absl::UnavailableError(absl::StrCat("cannot read ", path));
  return data.str();
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(
    const std::string& path) {
  SS_ASSIGN_OR_RETURN(std::string tokenizer_json, ReadFile(path, false));
  const std::string dir = DirName(path);
  SS_ASSIGN_OR_RETURN(std::string config_json,
                      ReadFile(dir + "/tokenizer_config.json", true));
  SS_ASSIGN_OR_RETURN(std::string generation_json,
                      ReadFile(dir + "/generation_config.json", true));
  auto spec = ParseTokenizerJson(tokenizer_json, config_json, generation_json);
  if (!spec.ok()) {
    return absl::Status(spec.status().code(),
                        absl::StrCat(path, ": ", spec.status().message()));
  }
  return FromSpec(std::move(spec).value());
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromSpec(
    TokenizerSpec spec) {
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  tok->normalizers_ = spec.normalizers;
  SS_ASSIGN_OR_RETURN(tok->pre_tokenizer_,
                      PreTokenizer::Create(spec.pre_tokenizer));
  SS_ASSIGN_OR_RETURN(tok->bpe_, BpeModel::Create(spec.bpe));

  uint32_t size = 0;
  for (const auto& [token, id] : spec.bpe.vocab) size = std::max(size, id + 1);
  for (const AddedToken& t : spec.added_tokens) size = std::max(size, t.id + 1);
  tok->tokens_.resize(size);
  for (const auto& [token, id] : spec.bpe.vocab) {
    TokenInfo& info = tok->tokens_[id];
    if (info.present) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.vocab: id ", id, " is used by both \"", info.text,
                       "\" and \"", token, "\""));
    }
    info.present = true;
    info.text = token;
    tok->token_to_id_.emplace(token, id);
  }
  // Added tokens override the model's entry for their id, and their content
  // maps to their id (HF looks up added tokens first).
  // HF decodes (and names) a normalized added token by its normalized content.
  for (const AddedToken& t : spec.added_tokens) {
    TokenInfo& info = tok->tokens_[t.id];
    info.present = true;
    info.text = t.normalized ? tok->Normalize(t.content) : t.content;
    info.special = t.special;
    tok->token_to_id_.insert_or_assign(t.content, t.id);
  }
  for (TokenInfo& info : tok->tokens_) {
    if (info.present && !ByteLevelToBytes(info.text, &info.bytes)) {
      info.bytes =
          info.text;  // HF's ByteLevel decoder keeps such tokens as they are
    }
  }

  // HF refuses nothing here; duplicates of one content keep the first entry.
  tok->added_tokens_ = std::move(spec.added_tokens);
  std::vector<std::string> raw_patterns, norm_patterns;
  std::vector<const AddedToken*> raw_tokens, norm_tokens;
  for (const AddedToken& t : tok->added_tokens_) {
    if (t.normalized) {
      norm_patterns.push_back(tok->Normalize(t.content));
      norm_tokens.push_back(&t);
    } else {
      raw_patterns.push_back(t.content);
      raw_tokens.push_back(&t);
    }
  }
  tok->raw_matcher_ = std::make_unique<AddedTokenMatcher>(
      std::move(raw_patterns), std::move(raw_tokens));
  tok->normalized_matcher_ = std::make_unique<AddedTokenMatcher>(
      std::move(norm_patterns), std::move(norm_tokens));
  tok->eos_token_ids_ = std::move(spec.eos_token_ids);
  for (uint32_t id : tok->eos_token_ids_) {
    if (id >= size || !tok->tokens_[id].present) {
      return absl::InvalidArgumentError(
          absl::StrCat("eos token id ", id, " is not in the vocabulary"));
    }
  }
  tok->bos_token_id_ = spec.bos_token_id;
  return tok;
}

std::string Tokenizer::Normalize(std::string_view text) const {
  std::string out(text);
  for (NormalizerKind kind : normalizers_) {
    switch (kind) {
      case NormalizerKind::kNfc:
        if (!IsNfcQuick(out)) out = ToNfc(out);
        break;
      case NormalizerKind::kNfd:
        out = ToNfd(out);
        break;
    }
  }
  return out;
}

void Tokenizer::EncodeOrdinary(std::string_view text, bool parse_special,
                               std::vector<uint32_t>* ids) const {
  // Normalization is skipped (no copy) when it would change nothing.
  std::string normalized_storage;
  std::string_view normalized = text;
  const bool needs_normalizing =
      !normalizers_.empty() &&
      !(normalizers_.size() == 1 && normalizers_[0] == NormalizerKind::kNfc &&
        IsNfcQuick(text));
  if (needs_normalizing) {
    normalized_storage = Normalize(text);
    normalized = normalized_storage;
  }
  std::vector<AddedSplit> splits;
  if (normalized_matcher_->empty()) {
    splits.push_back({0, normalized.size(), nullptr});
  } else {
    normalized_matcher_->Split(normalized, parse_special, &splits);
  }
  PieceArena arena;
  std::vector<std::string_view> pieces;
  for (const AddedSplit& split : splits) {
    if (split.token != nullptr) {
      ids->push_back(split.token->id);
      continue;
    }
    pieces.clear();
    pre_tokenizer_->Split(
        normalized.substr(split.start, split.end - split.start), &arena,
        &pieces);
    for (std::string_view piece : pieces) bpe_->EncodeWord(piece, ids);
  }
}

std::vector<uint32_t> Tokenizer::Encode(std::string_view text,
                                        bool parse_special) const {
  std::string repaired;
  if (!IsValidUtf8(text)) {
    repaired = Utf8Lossy(text);
    text = repaired;
  }
  std::vector<uint32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (raw_matcher_->empty()) {
    EncodeOrdinary(text, parse_special, &ids);
    return ids;
  }
  std::vector<AddedSplit> splits;
  raw_matcher_->Split(text, parse_special, &splits);
  for (const AddedSplit& split : splits) {
    if (split.token != nullptr) {
      ids.push_back(split.token->id);
    } else {
      EncodeOrdinary(text.substr(split.start, split.end - split.start),
                     parse_special, &ids);
    }
  }
  return ids;
}

absl::Status Tokenizer::DecodeBytes(absl::Span<const uint32_t> ids,
                                    bool skip_special, std::string* out) const {
  for (uint32_t id : ids) {
    if (id >= tokens_.size() || !tokens_[id].present) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is not in the vocabulary (size ",
                       tokens_.size(), ")"));
    }
    const TokenInfo& info = tokens_[id];
    if (skip_special && info.special) continue;
    out->append(info.bytes);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const uint32_t> ids,
                                              bool skip_special) const {
  std::string bytes;
  SS_RETURN_IF_ERROR(DecodeBytes(ids, skip_special, &bytes));
  if (IsValidUtf8(bytes)) return bytes;
  return Utf8Lossy(bytes);
}

std::optional<uint32_t> Tokenizer::TokenToId(std::string_view token) const {
  auto it = token_to_id_.find(absl::string_view(token.data(), token.size()));
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> Tokenizer::IdToToken(uint32_t id) const {
  if (id >= tokens_.size() || !tokens_[id].present) return std::nullopt;
  return tokens_[id].text;
}

}  // namespace specserve::tokenizer
