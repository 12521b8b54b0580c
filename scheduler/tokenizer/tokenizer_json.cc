// Parsing and validation of tokenizer.json (+ tokenizer_config.json and
// generation_config.json) into a TokenizerSpec. Every feature the C++ tokenizer
// does not implement is an InvalidArgument error naming the field, so a
// tokenizer is either encoded exactly like HF or not loaded at all.
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "scheduler/tokenizer/tokenizer.h"
#include "telemetry/status_macros.h"

namespace specserve::tokenizer {
namespace {

using json = nlohmann::json;

// Ids above this are refused: the id table is dense.
constexpr uint64_t kMaxId = 1u << 24;

absl::Status Invalid(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::StatusOr<json> ParseJson(std::string_view text, const std::string& file) {
  json j = json::parse(text.begin(), text.end(), /*cb=*/nullptr,
                       /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(file, " is not valid JSON"));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, " is not a JSON object"));
  }
  return j;
}

bool IsNull(const json& obj, const char* key) {
  return !obj.contains(key) || obj.at(key).is_null();
}

absl::StatusOr<bool> GetBool(const json& obj, const char* key, bool fallback,
                             const std::string& where) {
  if (IsNull(obj, key)) return fallback;
  const json& v = obj.at(key);
  if (!v.is_boolean())
    return Invalid(absl::StrCat(where, ".", key), "not a boolean");
  return v.get<bool>();
}

absl::StatusOr<std::string> GetString(const json& obj, const char* key,
                                      const std::string& where) {
  if (!obj.contains(key) || !obj.at(key).is_string()) {
    return Invalid(absl::StrCat(where, ".", key), "missing or not a string");
  }
  return obj.at(key).get<std::string>();
}

absl::StatusOr<std::string> GetType(const json& obj, const std::string& where) {
  if (!obj.is_object()) return Invalid(where, "not an object");
  return GetString(obj, "type", where);
}

absl::StatusOr<uint32_t> GetId(const json& v, const std::string& where) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
      static_cast<uint64_t>(v.get<int64_t>()) >= kMaxId) {
    return Invalid(where, absl::StrCat("not a token id in [0, ", kMaxId, ")"));
  }
  return static_cast<uint32_t>(v.get<int64_t>());
}

absl::Status ParseNormalizer(const json& n, const std::string& where,
                             std::vector<NormalizerKind>* out) {
  if (n.is_null()) return absl::OkStatus();
  SS_ASSIGN_OR_RETURN(std::string type, GetType(n, where));
  if (type == "NFC") {
    out->push_back(NormalizerKind::kNfc);
  } else if (type == "NFD") {
    out->push_back(NormalizerKind::kNfd);
  } else if (type == "Sequence") {
    if (!n.contains("normalizers") || !n.at("normalizers").is_array()) {
      return Invalid(where + ".normalizers", "missing or not an array");
    }
    const json& list = n.at("normalizers");
    for (size_t i = 0; i < list.size(); ++i) {
      SS_RETURN_IF_ERROR(ParseNormalizer(
          list[i], absl::StrCat(where, ".normalizers[", i, "]"), out));
    }
  } else {
    return Invalid(where + ".type",
                   absl::StrCat("normalizer \"", type,
                                "\" is not supported (NFC, NFD, Sequence)"));
  }
  return absl::OkStatus();
}

absl::Status ParsePreTokenizer(const json& p, const std::string& where,
                               std::vector<PreTokenizerStep>* out) {
  SS_ASSIGN_OR_RETURN(std::string type, GetType(p, where));
  if (type == "Sequence") {
    if (!p.contains("pretokenizers") || !p.at("pretokenizers").is_array()) {
      return Invalid(where + ".pretokenizers", "missing or not an array");
    }
    const json& list = p.at("pretokenizers");
    for (size_t i = 0; i < list.size(); ++i) {
      SS_RETURN_IF_ERROR(ParsePreTokenizer(
          list[i], absl::StrCat(where, ".pretokenizers[", i, "]"), out));
    }
    return absl::OkStatus();
  }
  PreTokenizerStep step;
  if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    SS_ASSIGN_OR_RETURN(step.add_prefix_space,
                        GetBool(p, "add_prefix_space", true, where));
    SS_ASSIGN_OR_RETURN(step.use_regex, GetBool(p, "use_regex", true, where));
  } else if (type == "Split") {
    step.kind = PreTokenizerStep::Kind::kSplit;
    if (!p.contains("pattern") || !p.at("pattern").is_object()) {
      return Invalid(where + ".pattern", "missing or not an object");
    }
    const json& pattern = p.at("pattern");
    if (pattern.contains("Regex") && pattern.at("Regex").is_string()) {
      step.pattern = pattern.at("Regex").get<std::string>();
    } else if (pattern.contains("String") && pattern.at("String").is_string()) {
      step.pattern = pattern.at("String").get<std::string>();
      step.literal = true;
    } else {
      return Invalid(where + ".pattern",
                     "needs a \"Regex\" or \"String\" string");
    }
    SS_ASSIGN_OR_RETURN(std::string behavior, GetString(p, "behavior", where));
    if (behavior == "Removed") {
      step.behavior = SplitBehavior::kRemoved;
    } else if (behavior == "Isolated") {
      step.behavior = SplitBehavior::kIsolated;
    } else if (behavior == "MergedWithPrevious") {
      step.behavior = SplitBehavior::kMergedWithPrevious;
    } else if (behavior == "MergedWithNext") {
      step.behavior = SplitBehavior::kMergedWithNext;
    } else if (behavior == "Contiguous") {
      step.behavior = SplitBehavior::kContiguous;
    } else {
      return Invalid(where + ".behavior",
                     absl::StrCat("unknown split behavior \"", behavior, "\""));
    }
    SS_ASSIGN_OR_RETURN(step.invert, GetBool(p, "invert", false, where));
  } else {
    return Invalid(
        where + ".type",
        absl::StrCat("pre-tokenizer \"", type,
                     "\" is not supported (Split, ByteLevel, Sequence)"));
  }
  out->push_back(std::move(step));
  return absl::OkStatus();
}

// Decoder and post-processor: only ByteLevel (alone or in a Sequence) is
// accepted.
absl::Status CheckByteLevelOnly(const json& v, const std::string& where,
                                const char* list_key, bool allow_null) {
  if (v.is_null()) {
    if (allow_null) return absl::OkStatus();
    return Invalid(where, "missing (a ByteLevel decoder is required)");
  }
  SS_ASSIGN_OR_RETURN(std::string type, GetType(v, where));
  if (type == "ByteLevel") return absl::OkStatus();
  if (type == "Sequence" && v.contains(list_key) && v.at(list_key).is_array() &&
      !v.at(list_key).empty()) {
    const json& list = v.at(list_key);
    for (size_t i = 0; i < list.size(); ++i) {
      SS_RETURN_IF_ERROR(CheckByteLevelOnly(
          list[i], absl::StrCat(where, ".", list_key, "[", i, "]"), list_key,
          /*allow_null=*/false));
    }
    return absl::OkStatus();
  }
  return Invalid(
      where + ".type",
      absl::StrCat("\"", type, "\" is not supported (only ByteLevel)"));
}

absl::Status ParseModel(const json& m, BpeConfig* bpe) {
  const std::string where = "model";
  if (!m.is_object()) return Invalid(where, "missing or not an object");
  if (m.contains("type")) {
    SS_ASSIGN_OR_RETURN(std::string type, GetString(m, "type", where));
    if (type != "BPE") {
      return Invalid("model.type", absl::StrCat("model \"", type,
                                                "\" is not supported (BPE)"));
    }
  }
  if (!IsNull(m, "dropout"))
    return Invalid("model.dropout", "BPE dropout is not supported");
  SS_ASSIGN_OR_RETURN(bool byte_fallback,
                      GetBool(m, "byte_fallback", false, where));
  if (byte_fallback)
    return Invalid("model.byte_fallback", "true is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!IsNull(m, key) && m.at(key) != json("")) {
      return Invalid(absl::StrCat("model.", key),
                     "only null or \"\" is supported");
    }
  }
  SS_ASSIGN_OR_RETURN(bpe->ignore_merges,
                      GetBool(m, "ignore_merges", false, where));
  SS_ASSIGN_OR_RETURN(bpe->fuse_unk, GetBool(m, "fuse_unk", false, where));

  if (!m.contains("vocab") || !m.at("vocab").is_object()) {
    return Invalid("model.vocab", "missing or not an object");
  }
  for (const auto& [token, id] : m.at("vocab").items()) {
    SS_ASSIGN_OR_RETURN(uint32_t value, GetId(id, absl::StrCat("model.vocab[\"",
                                                               token, "\"]")));
    bpe->vocab.emplace(token, value);
  }
  if (!IsNull(m, "unk_token")) {
    SS_ASSIGN_OR_RETURN(std::string unk, GetString(m, "unk_token", where));
    auto it = bpe->vocab.find(unk);
    if (it == bpe->vocab.end()) {
      return Invalid("model.unk_token",
                     absl::StrCat("\"", unk, "\" is not in the vocab"));
    }
    bpe->unk_id = it->second;
  }

  if (!m.contains("merges") || !m.at("merges").is_array()) {
    return Invalid("model.merges", "missing or not an array");
  }
  const json& merges = m.at("merges");
  bpe->merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& merge = merges[i];
    if (merge.is_string()) {
      const std::string s = merge.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos ||
          s.find(' ', space + 1) != std::string::npos) {
        return Invalid(
            absl::StrCat("model.merges[", i, "]"),
            "a string merge must be two tokens separated by one space");
      }
      bpe->merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      bpe->merges.emplace_back(merge[0].get<std::string>(),
                               merge[1].get<std::string>());
    } else {
      return Invalid(absl::StrCat("model.merges[", i, "]"),
                     "must be \"a b\" or [\"a\", \"b\"]");
    }
  }
  return absl::OkStatus();
}

absl::Status ParseAddedToken(const json& t, const std::string& where,
                             AddedToken* token) {
  if (!t.is_object()) return Invalid(where, "not an object");
  SS_ASSIGN_OR_RETURN(token->content, GetString(t, "content", where));
  SS_ASSIGN_OR_RETURN(token->special, GetBool(t, "special", false, where));
  SS_ASSIGN_OR_RETURN(token->single_word,
                      GetBool(t, "single_word", false, where));
  SS_ASSIGN_OR_RETURN(token->lstrip, GetBool(t, "lstrip", false, where));
  SS_ASSIGN_OR_RETURN(token->rstrip, GetBool(t, "rstrip", false, where));
  SS_ASSIGN_OR_RETURN(token->normalized,
                      GetBool(t, "normalized", !token->special, where));
  return absl::OkStatus();
}

// "eos_token": "<x>" or {"content": "<x>", ...} or null.
absl::StatusOr<std::optional<std::string>> ConfigTokenString(const json& config,
                                                             const char* key) {
  if (IsNull(config, key)) return std::optional<std::string>();
  const json& v = config.at(key);
  if (v.is_string()) return std::optional<std::string>(v.get<std::string>());
  if (v.is_object() && v.contains("content") && v.at("content").is_string()) {
    return std::optional<std::string>(v.at("content").get<std::string>());
  }
  return Invalid(absl::StrCat("tokenizer_config.json ", key),
                 "not a string or {\"content\": ...}");
}

absl::StatusOr<uint32_t> LookUp(const TokenizerSpec& spec,
                                const std::string& token,
                                const std::string& where) {
  for (const AddedToken& t : spec.added_tokens) {
    if (t.content == token) return t.id;
  }
  auto it = spec.bpe.vocab.find(token);
  if (it != spec.bpe.vocab.end()) return it->second;
  return Invalid(where, absl::StrCat("\"", token, "\" is not a token"));
}

void AddUnique(uint32_t id, std::vector<uint32_t>* ids) {
  for (uint32_t x : *ids) {
    if (x == id) return;
  }
  ids->push_back(id);
}

absl::Status ParseConfigs(std::string_view config_text,
                          std::string_view generation_text,
                          TokenizerSpec* spec) {
  if (!config_text.empty()) {
    SS_ASSIGN_OR_RETURN(json config,
                        ParseJson(config_text, "tokenizer_config.json"));
    if (config.contains("added_tokens_decoder") &&
        config.at("added_tokens_decoder").is_object()) {
      for (const auto& [key, value] :
           config.at("added_tokens_decoder").items()) {
        const std::string where = absl::StrCat(
            "tokenizer_config.json added_tokens_decoder[\"", key, "\"]");
        uint64_t parsed = 0;
        if (!absl::SimpleAtoi(key, &parsed) || parsed >= kMaxId) {
          return Invalid(where, "key is not a token id");
        }
        const uint32_t id = static_cast<uint32_t>(parsed);
        AddedToken token;
        SS_RETURN_IF_ERROR(ParseAddedToken(value, where, &token));
        token.id = id;
        bool known = false;
        for (const AddedToken& t : spec->added_tokens) {
          if (t.id != id) continue;
          if (t.content != token.content) {
            return Invalid(where,
                           absl::StrCat("content \"", token.content,
                                        "\" differs from tokenizer.json's \"",
                                        t.content, "\""));
          }
          known = true;  // tokenizer.json's flags win: HF tokenizers uses those
        }
        if (!known) spec->added_tokens.push_back(std::move(token));
      }
    }
    SS_ASSIGN_OR_RETURN(auto eos, ConfigTokenString(config, "eos_token"));
    if (eos.has_value()) {
      SS_ASSIGN_OR_RETURN(
          uint32_t id, LookUp(*spec, *eos, "tokenizer_config.json eos_token"));
      AddUnique(id, &spec->eos_token_ids);
    }
    SS_ASSIGN_OR_RETURN(auto bos, ConfigTokenString(config, "bos_token"));
    if (bos.has_value()) {
      SS_ASSIGN_OR_RETURN(
          spec->bos_token_id,
          LookUp(*spec, *bos, "tokenizer_config.json bos_token"));
    }
  }
  if (!generation_text.empty()) {
    SS_ASSIGN_OR_RETURN(json gen,
                        ParseJson(generation_text, "generation_config.json"));
    if (!IsNull(gen, "eos_token_id")) {
      const json& v = gen.at("eos_token_id");
      const std::string where = "generation_config.json eos_token_id";
      if (v.is_array()) {
        for (const json& e : v) {
          SS_ASSIGN_OR_RETURN(uint32_t id, GetId(e, where));
          AddUnique(id, &spec->eos_token_ids);
        }
      } else {
        SS_ASSIGN_OR_RETURN(uint32_t id, GetId(v, where));
        AddUnique(id, &spec->eos_token_ids);
      }
    }
    if (!spec->bos_token_id.has_value() && !IsNull(gen, "bos_token_id")) {
      SS_ASSIGN_OR_RETURN(
          spec->bos_token_id,
          GetId(gen.at("bos_token_id"), "generation_config.json bos_token_id"));
    }
  }
  if (config_text.empty() && generation_text.empty()) {
    // No config at all: the Qwen family's end tokens, if this vocabulary has
    // them.
    for (const AddedToken& t : spec->added_tokens) {
      if (t.special &&
          (t.content == "<|endoftext|>" || t.content == "<|im_end|>")) {
        AddUnique(t.id, &spec->eos_token_ids);
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TokenizerSpec> ParseUnchecked(std::string_view tokenizer_json,
                                             std::string_view config_json,
                                             std::string_view generation_json) {
  SS_ASSIGN_OR_RETURN(json root, ParseJson(tokenizer_json, "tokenizer.json"));
  TokenizerSpec spec;
  for (const char* key : {"truncation", "padding"}) {
    if (!IsNull(root, key)) return Invalid(key, "only null is supported");
  }
  SS_RETURN_IF_ERROR(ParseModel(
      root.contains("model") ? root.at("model") : json(), &spec.bpe));
  if (!IsNull(root, "normalizer")) {
    SS_RETURN_IF_ERROR(ParseNormalizer(root.at("normalizer"), "normalizer",
                                       &spec.normalizers));
  }
  if (IsNull(root, "pre_tokenizer")) {
    return Invalid("pre_tokenizer",
                   "missing (a ByteLevel pre-tokenizer is required)");
  }
  SS_RETURN_IF_ERROR(ParsePreTokenizer(root.at("pre_tokenizer"),
                                       "pre_tokenizer", &spec.pre_tokenizer));
  for (size_t i = 0; i < spec.pre_tokenizer.size(); ++i) {
    const bool byte_level =
        spec.pre_tokenizer[i].kind == PreTokenizerStep::Kind::kByteLevel;
    const bool last = i + 1 == spec.pre_tokenizer.size();
    if (byte_level != last) {
      return Invalid("pre_tokenizer",
                     "exactly one ByteLevel is supported, as the last step");
    }
  }
  SS_RETURN_IF_ERROR(
      CheckByteLevelOnly(root.contains("decoder") ? root.at("decoder") : json(),
                         "decoder", "decoders",
                         /*allow_null=*/false));
  SS_RETURN_IF_ERROR(CheckByteLevelOnly(
      root.contains("post_processor") ? root.at("post_processor") : json(),
      "post_processor", "processors", /*allow_null=*/true));

  if (!IsNull(root, "added_tokens")) {
    const json& list = root.at("added_tokens");
    if (!list.is_array()) return Invalid("added_tokens", "not an array");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string where = absl::StrCat("added_tokens[", i, "]");
      AddedToken token;
      SS_RETURN_IF_ERROR(ParseAddedToken(list[i], where, &token));
      if (!list[i].contains("id")) return Invalid(where + ".id", "missing");
      SS_ASSIGN_OR_RETURN(token.id, GetId(list[i].at("id"), where + ".id"));
      spec.added_tokens.push_back(std::move(token));
    }
  }
  SS_RETURN_IF_ERROR(ParseConfigs(config_json, generation_json, &spec));
  return spec;
}

}  // namespace

absl::StatusOr<TokenizerSpec> ParseTokenizerJson(
    std::string_view tokenizer_json, std::string_view config_json,
    std::string_view generation_json) {
  // nlohmann throws on type mismatches the checks above might have missed; such
  // a file is malformed, never a crash.
  try {
    return ParseUnchecked(tokenizer_json, config_json, generation_json);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed tokenizer files: ", e.what()));
  }
}

}  // namespace specserve::tokenizer
