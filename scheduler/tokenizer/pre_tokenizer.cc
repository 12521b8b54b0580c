#include "scheduler/tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "scheduler/tokenizer/unicode.h"

namespace specserve::tokenizer {
namespace {

// The pattern HF's ByteLevel pre-tokenizer splits with when use_regex is true.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

pcre2_code* Code(void* code) { return static_cast<pcre2_code*>(code); }

// Per-thread PCRE2 scratch: match data and a JIT stack large enough for long
// runs.
struct MatchScratch {
  pcre2_match_data* data;
  pcre2_match_context* context;
  pcre2_jit_stack* jit_stack;

  MatchScratch() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    CHECK(data != nullptr && context != nullptr && jit_stack != nullptr)
        << "out of memory creating PCRE2 scratch";
    pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchScratch& Scratch() {
  thread_local MatchScratch scratch;
  return scratch;
}

size_t NextCharEnd(std::string_view text, size_t pos) {
  if (pos >= text.size()) return pos + 1;
  DecodeUtf8(text, &pos);
  return pos;
}

}  // namespace

std::string RewriteWhitespaceClasses(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\' || i + 1 >= pattern.size()) {
      out.push_back(pattern[i]);
      continue;
    }
    const char next = pattern[++i];
    if (next == 's') {
      out += "\\p{White_Space}";
    } else if (next == 'S') {
      out += "\\P{White_Space}";
    } else {
      out.push_back('\\');
      out.push_back(next);  // also keeps "\\\\s" an escaped backslash + 's'
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern,
                                                      bool literal) {
  const std::string rewritten =
      literal ? std::string(pattern) : RewriteWhitespaceClasses(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  uint32_t options = PCRE2_UTF | PCRE2_UCP;
  if (literal) options |= PCRE2_LITERAL;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()),
                    rewritten.size(), options, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat(
        "regex \"", std::string(pattern), "\" does not compile at offset ",
        offset, ": ", reinterpret_cast<const char*>(message)));
  }
  // JIT is an optimization: without it pcre2_match interprets.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<Regex>(new Regex(code));
}

Regex::~Regex() { pcre2_code_free(Code(code_)); }

void Regex::FindAll(std::string_view text,
                    std::vector<std::pair<size_t, size_t>>* out) const {
  MatchScratch& scratch = Scratch();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos <= text.size()) {
    int rc = pcre2_match(Code(code_), subject, text.size(), pos,
                         PCRE2_NO_UTF_CHECK, scratch.data, scratch.context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_MATCHLIMIT ||
        rc == PCRE2_ERROR_HEAPLIMIT) {
      // Retry once with the interpreter, which keeps its backtracking on the
      // heap.
      rc = pcre2_match(Code(code_), subject, text.size(), pos,
                       PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, scratch.data,
                       scratch.context);
    }
    if (rc == PCRE2_ERROR_NOMATCH) return;
    // Only resource exhaustion can get here (the subject is valid UTF-8); the
    // patterns of real tokenizers never come near it.
    CHECK_GE(rc, 0) << "PCRE2 match failed with code " << rc;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.data);
    const size_t start = ovector[0], end = ovector[1];
    out->emplace_back(start, end);
    // An empty match moves on by one character, as Oniguruma's iterator does.
    pos = end > start ? end : NextCharEnd(text, end);
  }
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(
    const std::vector<PreTokenizerStep>& steps) {
  std::unique_ptr<PreTokenizer> pre(new PreTokenizer());
  for (const PreTokenizerStep& spec : steps) {
    Step step{spec, nullptr};
    if (spec.kind == PreTokenizerStep::Kind::kSplit) {
      auto regex = Regex::Compile(spec.pattern, spec.literal);
      if (!regex.ok()) return regex.status();
      step.regex = std::move(regex).value();
    } else if (spec.use_regex) {
      auto regex = Regex::Compile(kGpt2Pattern, /*literal=*/false);
      CHECK(regex.ok()) << "GPT-2 pattern must compile: " << regex.status();
      step.regex = std::move(regex).value();
    }
    pre->steps_.push_back(std::move(step));
  }
  return pre;
}

// Splits one piece by the step's regex and behavior (HF
// NormalizedString::split).
void PreTokenizer::ApplySplit(const Step& step, std::string_view piece,
                              std::vector<std::string_view>* out) const {
  std::vector<std::pair<size_t, size_t>> found;
  step.regex->FindAll(piece, &found);
  // (start, end, is_match) covering the whole piece.
  struct Part {
    size_t start, end;
    bool is_match;
  };
  std::vector<Part> parts;
  parts.reserve(found.size() * 2 + 1);
  size_t prev = 0;
  for (const auto& [start, end] : found) {
    if (prev != start) parts.push_back({prev, start, false});
    parts.push_back({start, end, true});
    prev = end;
  }
  if (prev != piece.size()) parts.push_back({prev, piece.size(), false});
  if (step.spec.invert) {
    for (Part& p : parts) p.is_match = !p.is_match;
  }

  auto emit = [&](size_t start, size_t end) {
    if (end > start) out->push_back(piece.substr(start, end - start));
  };
  switch (step.spec.behavior) {
    case SplitBehavior::kIsolated:
      for (const Part& p : parts) emit(p.start, p.end);
      return;
    case SplitBehavior::kRemoved:
      for (const Part& p : parts) {
        if (!p.is_match) emit(p.start, p.end);
      }
      return;
    case SplitBehavior::kContiguous:
    case SplitBehavior::kMergedWithPrevious: {
      std::vector<std::pair<size_t, size_t>> merged;
      bool previous_match = false;
      const bool contiguous = step.spec.behavior == SplitBehavior::kContiguous;
      for (const Part& p : parts) {
        const bool join = contiguous ? p.is_match == previous_match
                                     : p.is_match && !previous_match;
        if (join && !merged.empty()) {
          merged.back().second = p.end;
        } else {
          merged.emplace_back(p.start, p.end);
        }
        previous_match = p.is_match;
      }
      for (const auto& [s, e] : merged) emit(s, e);
      return;
    }
    case SplitBehavior::kMergedWithNext: {
      std::vector<std::pair<size_t, size_t>> merged;  // built back to front
      bool previous_match = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty()) {
          merged.back().first = it->start;
        } else {
          merged.emplace_back(it->start, it->end);
        }
        previous_match = it->is_match;
      }
      for (auto it = merged.rbegin(); it != merged.rend(); ++it) {
        emit(it->first, it->second);
      }
      return;
    }
  }
}

void PreTokenizer::Split(std::string_view text, PieceArena* arena,
                         std::vector<std::string_view>* pieces) const {
  std::vector<std::string_view> current;
  if (!text.empty()) current.push_back(text);
  std::vector<std::string_view> next;
  for (const Step& step : steps_) {
    next.clear();
    for (std::string_view piece : current) {
      if (step.spec.kind == PreTokenizerStep::Kind::kByteLevel) {
        if (step.spec.add_prefix_space && piece[0] != ' ') {
          arena->push_back(std::string(" ").append(piece));
          piece = arena->back();
        }
        if (!step.regex) {
          next.push_back(piece);
          continue;
        }
      }
      ApplySplit(step, piece, &next);
    }
    current.swap(next);
  }
  pieces->insert(pieces->end(), current.begin(), current.end());
}

}  // namespace specserve::tokenizer
