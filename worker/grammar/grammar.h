// Structured output: which tokens may come next so that a generation matches
// a grammar (a JSON schema, a regex, an EBNF grammar, a list of choices, or
// any JSON object). The grammar engine is xgrammar's C++ core (@xgrammar,
// the library vLLM, SGLang and TensorRT-LLM use); this file is its adapter:
// no xgrammar exception leaves it, a bad grammar is INVALID_ARGUMENT with
// the parser's message.
//
// One GrammarCompiler per model, built from the model's tokenizer.json,
// compiles a request's GrammarSpec into a CompiledGrammar (cached, shared,
// immutable). Each generating session owns a GrammarMatcher over it: before
// a token is drawn, FillMask gives the allowed tokens as a bitmask over the
// model's vocabulary (ApplyBitmask sets the others' logits to -inf); each
// committed token is Accept-ed; rejected drafts are rolled back with
// Rollback, and a session rewind restores a Snapshot.
#ifndef SPECSERVE_WORKER_GRAMMAR_GRAMMAR_H_
#define SPECSERVE_WORKER_GRAMMAR_GRAMMAR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "proto/api_limits.h"
#include "xgrammar/xgrammar.h"

namespace specserve::grammar {

// The most bytes of grammar text one GrammarSpec may carry (the schema, the
// regex, the EBNF, or all choices together; proto/api_limits.h): a larger
// one is INVALID_ARGUMENT naming it.
using ::specserve::kMaxGrammarTextBytes;

enum class GrammarKind {
  kJsonSchema,  // text: a JSON schema; the output is JSON that satisfies it
  kRegex,       // text: a regular expression the whole output matches
  kEbnf,        // text: an EBNF grammar (xgrammar's syntax) whose root rule
                // is named "root"
  kChoice,      // choices: the output is exactly one of them
  kJsonObject,  // the output is a JSON object (text unused)
};

// "json_schema", "regex", "ebnf", "choice" or "json_object".
absl::string_view GrammarKindName(GrammarKind kind);

struct GrammarSpec {
  GrammarKind kind = GrammarKind::kJsonObject;
  std::string text;
  std::vector<std::string> choices;  // kChoice only
};

// 32-bit words of a bitmask over `vocab_size` tokens: token t is allowed iff
// bit t % 32 of word t / 32 is 1 (xgrammar's layout).
int BitmaskWords(int vocab_size);

// Sets logits[t] to -infinity for every token t whose bit in `bitmask` is 0.
// `logits` is one row of the model's logits: logits.size() <=
// 32 * bitmask.size() (CHECKed).
void ApplyBitmask(absl::Span<const int32_t> bitmask, absl::Span<float> logits);

// A compiled grammar for one model's vocabulary. Cheap to copy (shared,
// immutable); matchers keep what they use alive.
class CompiledGrammar {
 public:
  int vocab_size() const { return vocab_size_; }
  // What identifies the spec it was compiled from (its kind and text; equal
  // specs give equal keys).
  const std::string& key() const { return key_; }
  // Approximate bytes held (the token-mask cache dominates).
  size_t MemoryBytes() const;

 private:
  friend class GrammarCompiler;
  friend class GrammarMatcher;
  CompiledGrammar(xgrammar::CompiledGrammar grammar, int vocab_size)
      : grammar_(std::move(grammar)), vocab_size_(vocab_size) {}

  xgrammar::CompiledGrammar grammar_;
  int vocab_size_;
  std::string key_;
};

struct GrammarCompilerOptions {
  // Threads one compile may use to precompute token masks.
  int max_threads = 2;
  // The cache of compiled grammars keeps the most recently used ones up to
  // these bounds (grammar bytes plus key bytes, and entries).
  size_t cache_bytes = 256 << 20;
  int cache_entries = 256;
  // JSON output (json_schema, json_object) may put whitespace between
  // tokens, at most this many characters in one place (vLLM's default is
  // any whitespace; the bound keeps a model from looping on it, and
  // pretty-printing to a depth of 15 at 4 spaces fits in 64). 0: none but
  // the fixed separators ", " and ": ", for models that waste tokens on
  // whitespace (the worker's --json_whitespace).
  int json_whitespace = 64;
};

// Compiles GrammarSpecs for one model's vocabulary; thread-safe. Compiles of
// one spec (kind, text, choices) are cached: a later Compile of the same spec
// returns the same CompiledGrammar while it is cached. Only successful
// compiles are cached, so refused specs cost no memory.
class GrammarCompiler {
 public:
  // From a Hugging Face tokenizer.json: the vocabulary (model.vocab and
  // added_tokens) and how its tokens encode bytes (byte-level, byte-fallback
  // or raw, as xgrammar detects from the decoder and normalizer).
  // `vocab_size` is the model's (the logits row, may exceed the tokenizer's:
  // the extra ids are never allowed); token ids at or past it are dropped.
  // `stop_token_ids` (at least one) end the output once the grammar is
  // complete. Other special added tokens are never allowed. INVALID_ARGUMENT
  // for a malformed tokenizer.json, no stop token or an id out of range.
  static absl::StatusOr<std::unique_ptr<GrammarCompiler>> FromTokenizerJson(
      absl::string_view tokenizer_json, int vocab_size,
      const std::vector<int32_t>& stop_token_ids,
      const GrammarCompilerOptions& options = {});

  // From a model directory: `model_dir`/tokenizer.json, with the vocabulary
  // size and end-of-sequence ids (the stop tokens) of its config.json.
  static absl::StatusOr<std::unique_ptr<GrammarCompiler>> FromModelDir(
      const std::string& model_dir, const GrammarCompilerOptions& options = {});

  int vocab_size() const { return vocab_size_; }

  // INVALID_ARGUMENT naming kMaxGrammarTextBytes when the spec is over it,
  // with the parser's message when the schema, regex or grammar is invalid,
  // or when a choice list is empty.
  absl::StatusOr<CompiledGrammar> Compile(const GrammarSpec& spec)
      ABSL_LOCKS_EXCLUDED(mu_);

  // What the cache holds now.
  size_t cache_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  int cache_entries() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct CacheEntry {
    CompiledGrammar grammar;
    size_t bytes;
    uint64_t last_use;
  };

  GrammarCompiler(xgrammar::GrammarCompiler compiler, int vocab_size,
                  const GrammarCompilerOptions& options);
  absl::StatusOr<CompiledGrammar> CompileUncached(GrammarKind kind,
                                                  const std::string& text);
  void EvictLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  xgrammar::GrammarCompiler compiler_;
  const int vocab_size_;
  const GrammarCompilerOptions options_;

  mutable absl::Mutex mu_;
  // Key: the kind's name, a NUL, the text (a choice list as its EBNF).
  absl::flat_hash_map<std::string, CacheEntry> cache_ ABSL_GUARDED_BY(mu_);
  size_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t uses_ ABSL_GUARDED_BY(mu_) = 0;
};

// One session's position in a grammar. Not thread-safe (the session's owner
// calls it). Move-only: Fork makes an independent copy.
class GrammarMatcher {
 public:
  // A point to come back to with Restore: how many tokens were accepted, and
  // which accept put the last of them in.
  struct Snapshot {
    int num_accepted = 0;
    uint64_t last_accept = 0;  // 0: none accepted
  };

  static absl::StatusOr<GrammarMatcher> Create(const CompiledGrammar& grammar);

  GrammarMatcher(GrammarMatcher&&) = default;
  GrammarMatcher& operator=(GrammarMatcher&&) = default;
  GrammarMatcher(const GrammarMatcher&) = delete;
  GrammarMatcher& operator=(const GrammarMatcher&) = delete;

  int vocab_size() const { return vocab_size_; }
  int bitmask_words() const { return BitmaskWords(vocab_size_); }

  // Writes the tokens allowed next into `bitmask` (bitmask_words() words,
  // CHECKed; the bits past vocab_size() are 0) and returns how many there
  // are. Once the grammar is complete the stop tokens are among them. 0 while
  // !IsTerminated() is a dead end: no token of the vocabulary continues the
  // grammar. After termination nothing is allowed.
  absl::StatusOr<int> FillMask(absl::Span<int32_t> bitmask);

  // Advances past `token` when the grammar allows it there; otherwise
  // returns false and changes nothing.
  bool Accept(int32_t token);

  // Undoes the last `n` accepted tokens (a stop token included). Every
  // accepted token can be rolled back: a verify's rejected drafts (at most
  // kMaxDraftDepth + 1, proto/api_limits.h) as well as a rewind.
  // INVALID_ARGUMENT when n < 0 or more than num_accepted().
  absl::Status Rollback(int n);

  // A stop token was accepted: the output is finished.
  bool IsTerminated() const;
  // The tokens accepted so far are a complete match (a stop token may come
  // next, or is already accepted).
  bool IsCompleted() const;
  int num_accepted() const { return static_cast<int>(accepts_.size()); }

  // TakeSnapshot copies two numbers. Restore rolls back to the snapshot
  // (the tokens accepted since); FAILED_PRECONDITION when the matcher has
  // been rolled back past it since (its tokens are gone).
  Snapshot TakeSnapshot() const;
  absl::Status Restore(const Snapshot& snapshot);

  // An independent matcher in the same state (for a forked session).
  absl::StatusOr<GrammarMatcher> Fork() const;

 private:
  GrammarMatcher(xgrammar::GrammarMatcher matcher,
                 xgrammar::TokenizerInfo tokenizer, int vocab_size)
      : matcher_(std::move(matcher)),
        tokenizer_(std::move(tokenizer)),
        vocab_size_(vocab_size) {}

  xgrammar::GrammarMatcher matcher_;
  xgrammar::TokenizerInfo tokenizer_;  // shared with the compiled grammar
  int vocab_size_;
  // accepts_[i]: the number of the accept that put in token i, unique in the
  // process, so a snapshot's last token is still in iff its number is still
  // at its place (in this matcher or a fork of it).
  std::vector<uint64_t> accepts_;
};

}  // namespace specserve::grammar

#endif  // SPECSERVE_WORKER_GRAMMAR_GRAMMAR_H_
