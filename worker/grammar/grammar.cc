#include "worker/grammar/grammar.h"

#include <algorithm>
#include <atomic>
#include <bitset>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "dlpack/dlpack.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"
#include "telemetry/status_macros.h"
#include "worker/model_files/model_config.h"

namespace specserve::grammar {
namespace {

// The most bytes of a library message passed on: some quote the whole
// grammar text, and a status message travels in a gRPC trailer (8 KiB of
// metadata by default).
constexpr size_t kMaxMessageBytes = 1024;

// `message` without the library's check prefix ("Check failed: (cond) is
// false: "), cut to kMaxMessageBytes.
std::string LibraryMessage(absl::string_view message) {
  constexpr absl::string_view kCheck = "Check failed: ";
  constexpr absl::string_view kIsFalse = " is false: ";
  if (absl::StartsWith(message, kCheck)) {
    const size_t end = message.find(kIsFalse);
    if (end != absl::string_view::npos) {
      message.remove_prefix(end + kIsFalse.size());
    }
  }
  if (message.size() <= kMaxMessageBytes) return std::string(message);
  return absl::StrCat(message.substr(0, kMaxMessageBytes), "...");
}

// Runs `f`, an xgrammar call. xgrammar reports a bad grammar (and a broken
// precondition) by throwing; the exception becomes a status with `code`,
// prefixed by `context`. A std::runtime_error's own message is used: the
// library's fatal-error type overrides what() to add a time and a source
// line, which are not the caller's business.
template <typename F>
absl::Status CatchXgrammar(absl::StatusCode code, absl::string_view context,
                           F&& f) {
  try {
    f();
    return absl::OkStatus();
  } catch (const std::runtime_error& e) {
    return absl::Status(
        code, absl::StrCat(context, ": ",
                           LibraryMessage(e.std::runtime_error::what())));
  } catch (const std::exception& e) {
    return absl::Status(code,
                        absl::StrCat(context, ": ", LibraryMessage(e.what())));
  } catch (...) {
    return absl::Status(code, absl::StrCat(context, ": unknown error"));
  }
}

absl::Status ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::InternalError(absl::StrCat("cannot read ", path));
  *out = std::move(text).str();
  return absl::OkStatus();
}

// The tokens of a tokenizer.json by id, as Hugging Face's get_vocab() gives
// them (encoded: "Ġthe" for " the" in a byte-level vocabulary), "" for ids
// with no token; ids at or past `vocab_size` are dropped. Special added
// tokens ("<|im_end|>") are "" too, which xgrammar never allows: their text
// would otherwise match inside strings, and a chat template's control token
// in the middle of an output ends or corrupts it. Stop tokens keep theirs
// (xgrammar knows them by id).
absl::StatusOr<std::vector<std::string>> EncodedVocab(
    const nlohmann::json& tokenizer, int vocab_size,
    const std::vector<int32_t>& stop_token_ids) {
  std::vector<std::string> vocab(vocab_size);
  auto put = [&](const nlohmann::json& id, const nlohmann::json& token) {
    if (!id.is_number_integer() || !token.is_string() || id.get<int64_t>() < 0)
      return false;
    if (id.get<int64_t>() < vocab_size) {
      vocab[id.get<int64_t>()] = token.get<std::string>();
    }
    return true;
  };
  const auto model = tokenizer.find("model");
  if (model == tokenizer.end() || !model->is_object() ||
      !model->contains("vocab")) {
    return absl::InvalidArgumentError("tokenizer.json has no model.vocab");
  }
  const nlohmann::json& model_vocab = (*model)["vocab"];
  if (model_vocab.is_object()) {  // BPE, WordPiece, WordLevel: token -> id
    for (const auto& [token, id] : model_vocab.items()) {
      if (!put(id, token)) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer.json model.vocab: bad id of ", token));
      }
    }
  } else if (model_vocab.is_array()) {  // Unigram: [[piece, score], ...]
    for (size_t i = 0; i < model_vocab.size(); ++i) {
      const nlohmann::json& entry = model_vocab[i];
      if (!entry.is_array() || entry.empty() || !put(i, entry[0])) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer.json model.vocab: bad entry ", i));
      }
    }
  } else {
    return absl::InvalidArgumentError(
        "tokenizer.json model.vocab is neither an object nor an array");
  }
  const auto added = tokenizer.find("added_tokens");
  if (added != tokenizer.end() && added->is_array()) {
    for (const nlohmann::json& token : *added) {
      if (!token.is_object()) {
        return absl::InvalidArgumentError(
            "tokenizer.json added_tokens: an entry is not an object");
      }
      const nlohmann::json id = token.value("id", nlohmann::json());
      const auto special = token.find("special");
      const bool hidden =
          special != token.end() && special->is_boolean() &&
          special->get<bool>() && id.is_number_integer() &&
          std::find(stop_token_ids.begin(), stop_token_ids.end(),
                    id.get<int64_t>()) == stop_token_ids.end();
      if (!put(id, hidden ? nlohmann::json("")
                          : token.value("content", nlohmann::json()))) {
        return absl::InvalidArgumentError(
            "tokenizer.json added_tokens: an entry without an id and content");
      }
    }
  }
  return vocab;
}

// An EBNF string literal that matches exactly `s`. Quotes and backslashes
// are escaped, control bytes written as 4-digit \u escapes (xgrammar's \x
// takes any number of hex digits, so a following digit would join it), and
// the rest (UTF-8 included) kept as is; invalid UTF-8 is the parser's to
// refuse.
std::string EbnfLiteral(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\u00";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
  return out;
}

std::string ChoiceEbnf(const std::vector<std::string>& choices) {
  std::string ebnf = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i > 0) ebnf += " | ";
    ebnf += EbnfLiteral(choices[i]);
  }
  return ebnf;
}

size_t SpecBytes(const GrammarSpec& spec) {
  if (spec.kind != GrammarKind::kChoice) return spec.text.size();
  size_t bytes = 0;
  for (const std::string& choice : spec.choices) bytes += choice.size() + 1;
  return bytes;
}

// Allowed tokens among the first `vocab_size` bits; clears the bits past it.
int CountAndTrim(absl::Span<int32_t> bitmask, int vocab_size) {
  const int full_words = vocab_size / 32;
  const int tail_bits = vocab_size % 32;
  if (tail_bits != 0) {
    bitmask[full_words] = static_cast<int32_t>(
        static_cast<uint32_t>(bitmask[full_words]) & ((1u << tail_bits) - 1));
  }
  int count = 0;
  for (int32_t word : bitmask) {
    count += std::bitset<32>(static_cast<uint32_t>(word)).count();
  }
  return count;
}

std::atomic<uint64_t> next_accept_number{1};

}  // namespace

absl::string_view GrammarKindName(GrammarKind kind) {
  switch (kind) {
    case GrammarKind::kJsonSchema:
      return "json_schema";
    case GrammarKind::kRegex:
      return "regex";
    case GrammarKind::kEbnf:
      return "ebnf";
    case GrammarKind::kChoice:
      return "choice";
    case GrammarKind::kJsonObject:
      return "json_object";
  }
  return "unknown";
}

int BitmaskWords(int vocab_size) { return (vocab_size + 31) / 32; }

void ApplyBitmask(absl::Span<const int32_t> bitmask, absl::Span<float> logits) {
  CHECK_LE(logits.size(), 32 * bitmask.size())
      << "the bitmask covers fewer tokens than the logits row";
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  for (size_t w = 0; w * 32 < logits.size(); ++w) {
    const uint32_t word = static_cast<uint32_t>(bitmask[w]);
    if (word == ~0u) continue;
    const size_t end = std::min(logits.size(), 32 * w + 32);
    for (size_t t = 32 * w; t < end; ++t) {
      if (((word >> (t % 32)) & 1u) == 0) logits[t] = kMasked;
    }
  }
}

size_t CompiledGrammar::MemoryBytes() const {
  return grammar_.MemorySizeBytes();
}

GrammarCompiler::GrammarCompiler(xgrammar::GrammarCompiler compiler,
                                 int vocab_size,
                                 const GrammarCompilerOptions& options)
    : compiler_(std::move(compiler)),
      vocab_size_(vocab_size),
      options_(options) {}

absl::StatusOr<std::unique_ptr<GrammarCompiler>>
GrammarCompiler::FromTokenizerJson(absl::string_view tokenizer_json,
                                   int vocab_size,
                                   const std::vector<int32_t>& stop_token_ids,
                                   const GrammarCompilerOptions& options) {
  if (vocab_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size ", vocab_size, " is not positive"));
  }
  if (stop_token_ids.empty()) {
    return absl::InvalidArgumentError(
        "no stop token: a grammar's output needs a token that ends it");
  }
  for (int32_t id : stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop token id ", id, " is outside the vocabulary [0, ",
                       vocab_size, ")"));
    }
  }
  const nlohmann::json tokenizer =
      nlohmann::json::parse(tokenizer_json.begin(), tokenizer_json.end(),
                            /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (!tokenizer.is_object()) {
    return absl::InvalidArgumentError("tokenizer.json is not a JSON object");
  }
  SS_ASSIGN_OR_RETURN(std::vector<std::string> vocab,
                      EncodedVocab(tokenizer, vocab_size, stop_token_ids));

  std::optional<xgrammar::GrammarCompiler> compiler;
  SS_RETURN_IF_ERROR(
      CatchXgrammar(absl::StatusCode::kInvalidArgument, "tokenizer.json", [&] {
        const nlohmann::json metadata =
            nlohmann::json::parse(xgrammar::TokenizerInfo::DetectMetadataFromHF(
                std::string(tokenizer_json)));
        xgrammar::TokenizerInfo info(
            vocab,
            static_cast<xgrammar::VocabType>(
                metadata.at("vocab_type").get<int>()),
            vocab_size, stop_token_ids,
            metadata.at("add_prefix_space").get<bool>());
        // xgrammar's own cache is off: it keeps failed compiles forever and
        // does not count its keys' bytes, so ours (bounded) stands in for it.
        compiler.emplace(info, options.max_threads, /*cache_enabled=*/false);
      }));
  return std::unique_ptr<GrammarCompiler>(
      new GrammarCompiler(std::move(*compiler), vocab_size, options));
}

absl::StatusOr<std::unique_ptr<GrammarCompiler>> GrammarCompiler::FromModelDir(
    const std::string& model_dir, const GrammarCompilerOptions& options) {
  SS_ASSIGN_OR_RETURN(model_files::ModelConfig config,
                      model_files::LoadModelConfig(model_dir));
  std::string tokenizer_json;
  SS_RETURN_IF_ERROR(ReadFile(model_dir + "/tokenizer.json", &tokenizer_json));
  std::vector<int32_t> stop(config.eos_token_ids.begin(),
                            config.eos_token_ids.end());
  return FromTokenizerJson(tokenizer_json, config.vocab_size, stop, options);
}

absl::StatusOr<CompiledGrammar> GrammarCompiler::Compile(
    const GrammarSpec& spec) {
  const absl::string_view kind = GrammarKindName(spec.kind);
  const size_t bytes = SpecBytes(spec);
  if (bytes > kMaxGrammarTextBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(kind, " grammar text is ", bytes,
                     " bytes, over the limit ", kMaxGrammarTextBytes));
  }
  std::string text;
  switch (spec.kind) {
    case GrammarKind::kChoice:
      if (spec.choices.empty()) {
        return absl::InvalidArgumentError("choice needs at least one string");
      }
      text = ChoiceEbnf(spec.choices);
      break;
    case GrammarKind::kJsonObject:
      break;
    default:
      text = spec.text;
  }
  std::string key = absl::StrCat(kind, absl::string_view("\0", 1), text);
  {
    absl::MutexLock lock(&mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      it->second.last_use = ++uses_;
      return it->second.grammar;
    }
  }
  // Compiled outside the lock (it may take long); if another thread cached
  // the same spec meanwhile, its grammar is kept and returned.
  SS_ASSIGN_OR_RETURN(CompiledGrammar grammar,
                      CompileUncached(spec.kind, text));
  grammar.key_ = key;
  const size_t entry_bytes = grammar.MemoryBytes() + key.size();
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = cache_.try_emplace(
      std::move(key), CacheEntry{grammar, entry_bytes, ++uses_});
  if (!inserted) return it->second.grammar;
  cached_bytes_ += entry_bytes;
  EvictLocked();
  return grammar;
}

absl::StatusOr<CompiledGrammar> GrammarCompiler::CompileUncached(
    GrammarKind kind, const std::string& text) {
  std::optional<xgrammar::CompiledGrammar> compiled;
  const bool any_whitespace = options_.json_whitespace > 0;
  const std::optional<int> max_whitespace =
      any_whitespace ? std::optional<int>(options_.json_whitespace)
                     : std::nullopt;
  SS_RETURN_IF_ERROR(CatchXgrammar(
      absl::StatusCode::kInvalidArgument,
      absl::StrCat("invalid ", GrammarKindName(kind)), [&] {
        switch (kind) {
          case GrammarKind::kJsonSchema:
            compiled = compiler_.CompileJSONSchema(
                text, any_whitespace, /*indent=*/std::nullopt,
                /*separators=*/std::nullopt, /*strict_mode=*/true,
                max_whitespace);
            break;
          case GrammarKind::kJsonObject:
            // Any object: properties are not limited to the (no) listed ones.
            compiled = compiler_.CompileJSONSchema(
                R"({"type": "object"})", any_whitespace,
                /*indent=*/std::nullopt, /*separators=*/std::nullopt,
                /*strict_mode=*/false, max_whitespace);
            break;
          case GrammarKind::kRegex:
            compiled = compiler_.CompileRegex(text);
            break;
          case GrammarKind::kEbnf:
          case GrammarKind::kChoice:
            compiled = compiler_.CompileGrammar(text, "root");
            break;
        }
      }));
  return CompiledGrammar(std::move(*compiled), vocab_size_);
}

void GrammarCompiler::EvictLocked() {
  while (!cache_.empty() &&
         (cached_bytes_ > options_.cache_bytes ||
          static_cast<int>(cache_.size()) > options_.cache_entries)) {
    auto oldest = cache_.begin();
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (it->second.last_use < oldest->second.last_use) oldest = it;
    }
    cached_bytes_ -= oldest->second.bytes;
    cache_.erase(oldest);
  }
}

size_t GrammarCompiler::cache_bytes() const {
  absl::MutexLock lock(&mu_);
  return cached_bytes_;
}

int GrammarCompiler::cache_entries() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(cache_.size());
}

absl::StatusOr<GrammarMatcher> GrammarMatcher::Create(
    const CompiledGrammar& grammar) {
  std::optional<xgrammar::GrammarMatcher> matcher;
  std::optional<xgrammar::TokenizerInfo> tokenizer;
  SS_RETURN_IF_ERROR(
      CatchXgrammar(absl::StatusCode::kInternal, "grammar matcher", [&] {
        matcher.emplace(grammar.grammar_);
        tokenizer.emplace(grammar.grammar_.GetTokenizerInfo());
      }));
  return GrammarMatcher(std::move(*matcher), std::move(*tokenizer),
                        grammar.vocab_size());
}

absl::StatusOr<int> GrammarMatcher::FillMask(absl::Span<int32_t> bitmask) {
  CHECK_EQ(static_cast<int>(bitmask.size()), bitmask_words())
      << "the bitmask must have one bit per token of the vocabulary";
  if (IsTerminated()) {
    std::fill(bitmask.begin(), bitmask.end(), 0);
    return 0;
  }
  int64_t shape[1] = {static_cast<int64_t>(bitmask.size())};
  DLTensor tensor{};
  tensor.data = bitmask.data();
  tensor.device = DLDevice{kDLCPU, 0};
  tensor.ndim = 1;
  tensor.dtype = xgrammar::GetBitmaskDLType();
  tensor.shape = shape;
  SS_RETURN_IF_ERROR(
      CatchXgrammar(absl::StatusCode::kInternal, "grammar mask",
                    [&] { matcher_.FillNextTokenBitmask(&tensor); }));
  return CountAndTrim(bitmask, vocab_size_);
}

bool GrammarMatcher::Accept(int32_t token) {
  // Out-of-range ids, special tokens and tokens after the end are refused
  // here: xgrammar would refuse them too, but with a warning on stderr.
  // Special ids are in increasing order (xgrammar collects them by id).
  const std::vector<int32_t>& special = tokenizer_.GetSpecialTokenIds();
  if (token < 0 || token >= vocab_size_ || IsTerminated() ||
      std::binary_search(special.begin(), special.end(), token)) {
    return false;
  }
  bool accepted = false;
  const absl::Status status =
      CatchXgrammar(absl::StatusCode::kInternal, "grammar accept",
                    [&] { accepted = matcher_.AcceptToken(token); });
  if (!status.ok()) {
    LOG(ERROR) << status;
    return false;
  }
  if (accepted) accepts_.push_back(next_accept_number.fetch_add(1));
  return accepted;
}

absl::Status GrammarMatcher::Rollback(int n) {
  if (n < 0 || n > num_accepted()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot roll back ", n, " tokens: ", num_accepted(), " are accepted"));
  }
  if (n == 0) return absl::OkStatus();
  SS_RETURN_IF_ERROR(CatchXgrammar(absl::StatusCode::kInternal,
                                   "grammar rollback",
                                   [&] { matcher_.Rollback(n); }));
  accepts_.resize(accepts_.size() - n);
  return absl::OkStatus();
}

bool GrammarMatcher::IsTerminated() const { return matcher_.IsTerminated(); }

bool GrammarMatcher::IsCompleted() const { return matcher_.IsCompleted(); }

GrammarMatcher::Snapshot GrammarMatcher::TakeSnapshot() const {
  return Snapshot{num_accepted(), accepts_.empty() ? 0 : accepts_.back()};
}

absl::Status GrammarMatcher::Restore(const Snapshot& snapshot) {
  const int n = snapshot.num_accepted;
  if (n > num_accepted() ||
      (n > 0 && accepts_[n - 1] != snapshot.last_accept)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the grammar snapshot at ", n,
                     " tokens is gone: the matcher was rolled back past it"));
  }
  return Rollback(num_accepted() - n);
}

absl::StatusOr<GrammarMatcher> GrammarMatcher::Fork() const {
  std::optional<xgrammar::GrammarMatcher> fork;
  SS_RETURN_IF_ERROR(CatchXgrammar(absl::StatusCode::kInternal, "grammar fork",
                                   [&] { fork.emplace(matcher_.Fork()); }));
  GrammarMatcher copy(std::move(*fork), tokenizer_, vocab_size_);
  copy.accepts_ = accepts_;
  return copy;
}

}  // namespace specserve::grammar
