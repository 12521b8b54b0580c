#include "worker/grammar/grammar_cursor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "telemetry/status_macros.h"

namespace specserve::grammar {

absl::StatusOr<GrammarCursor> GrammarCursor::Start(
    const CompiledGrammar& grammar, std::string key, int64_t output_start) {
  SS_ASSIGN_OR_RETURN(GrammarMatcher matcher, GrammarMatcher::Create(grammar));
  return GrammarCursor(std::move(matcher), std::move(key), output_start);
}

void GrammarCursor::Push(int32_t token) {
  if (on_grammar()) matcher_.Accept(token);
  ++pushed_;
}

void GrammarCursor::PopTo(int64_t length) {
  CHECK(length >= output_start_ && length <= this->length())
      << "grammar cursor: pop to " << length << " outside [" << output_start_
      << ", " << this->length() << "]";
  pushed_ = length - output_start_;
  const int excess = matcher_.num_accepted() - static_cast<int>(pushed_);
  if (excess > 0) {
    const absl::Status rolled_back = matcher_.Rollback(excess);
    CHECK(rolled_back.ok()) << rolled_back;
  }
}

absl::StatusOr<bool> GrammarCursor::FillMask(absl::Span<int32_t> bitmask) {
  if (!on_grammar() || matcher_.IsTerminated()) return false;
  SS_ASSIGN_OR_RETURN(const int allowed, matcher_.FillMask(bitmask));
  if (allowed == 0) {
    return absl::OutOfRangeError(absl::StrCat(
        "structured output reached a dead end after ", pushed_,
        " output tokens: no token of the vocabulary continues the grammar"));
  }
  return true;
}

}  // namespace specserve::grammar
