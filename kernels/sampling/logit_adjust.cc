#include "kernels/sampling/logit_adjust.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace specserve::sampling {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kMaxFinite = std::numeric_limits<float>::max();

absl::Status Invalid(absl::string_view field, float value,
                     absl::string_view allowed) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, " = ", value, "; it must be ", allowed));
}

}  // namespace

absl::Status ValidateLogitAdjustments(const LogitAdjustments& a, int vocab) {
  for (const auto& [field, value] :
       {std::make_pair("sampling.presence_penalty", a.presence_penalty),
        std::make_pair("sampling.frequency_penalty", a.frequency_penalty)}) {
    // NaN fails the comparison.
    if (!(std::fabs(value) <= kMaxAbsPenalty)) {
      return Invalid(field, value, "in [-2, 2] (0 = off)");
    }
  }
  if (!(a.repetition_penalty > 0.0f) || !std::isfinite(a.repetition_penalty)) {
    return Invalid("sampling.repetition_penalty", a.repetition_penalty,
                   "finite and > 0 (1 = off)");
  }
  if (a.logit_bias.size() > static_cast<size_t>(kMaxLogitBias)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.logit_bias has ", a.logit_bias.size(),
                     " entries; at most ", kMaxLogitBias, " are allowed"));
  }
  absl::flat_hash_set<int32_t> seen;
  for (const auto& [id, bias] : a.logit_bias) {
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sampling.logit_bias: token id ", id,
          " is outside the vocabulary (ids must be < ", vocab, ")"));
    }
    if (!seen.insert(id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.logit_bias: token id ", id, " is repeated"));
    }
    if (!(std::fabs(bias) <= kMaxAbsLogitBias)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.logit_bias[", id, "] = ", bias,
                       "; a bias must be in [-100, 100]"));
    }
  }
  if (a.min_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("stopping.min_tokens = ", a.min_tokens, " is negative"));
  }
  for (int32_t id : a.stop_ids) {
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stop token id ", id, " is outside the vocabulary (ids must be < ",
          vocab, ")"));
    }
  }
  return absl::OkStatus();
}

TokenCounts::TokenCounts(absl::Span<const int32_t> history,
                         int64_t output_start, bool count)
    : prompt_len_(output_start), count_(count) {
  CHECK(output_start >= 0 &&
        output_start <= static_cast<int64_t>(history.size()))
      << "the output starts at " << output_start << " in a history of "
      << history.size();
  if (count_) {
    prompt_.insert(history.begin(), history.begin() + output_start);
  }
  for (size_t i = output_start; i < history.size(); ++i) Push(history[i]);
}

void TokenCounts::Push(int32_t token) {
  output_.push_back(token);
  if (count_) ++output_counts_[token];
}

void TokenCounts::PopTo(int64_t length) {
  CHECK(length >= prompt_len_ && length <= this->length())
      << "PopTo " << length << " outside [" << prompt_len_ << ", "
      << this->length() << "]";
  while (this->length() > length) {
    const int32_t token = output_.back();
    output_.pop_back();
    if (!count_) continue;
    auto it = output_counts_.find(token);
    if (--it->second == 0) output_counts_.erase(it);
  }
}

void ApplyLogitAdjustments(const LogitAdjustments& a, const TokenCounts& c,
                           absl::Span<float> logits) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  auto at = [&](int32_t token) -> float& {
    CHECK(token >= 0 && token < vocab)
        << "token " << token << " outside a row of " << vocab;
    return logits[token];
  };
  if (a.masks() && c.output_len() < a.min_tokens) {
    for (int32_t id : a.stop_ids) at(id) = -kInf;
  }
  for (const auto& [id, bias] : a.logit_bias) at(id) += bias;
  if (a.repetition_penalty != 1.0f) {
    const float r = a.repetition_penalty;
    auto penalize = [&](int32_t token) {
      float& x = at(token);
      // Saturating, so a finite logit stays finite; -inf (masked) stays.
      if (x > 0.0f) {
        x = std::min(x / r, kMaxFinite);
      } else if (x > -kInf) {
        x = std::max(x * r, -kMaxFinite);
      }
    };
    for (int32_t token : c.prompt_tokens()) penalize(token);
    for (const auto& [token, n] : c.output_counts()) {
      if (!c.prompt_tokens().contains(token)) penalize(token);
    }
  }
  if (a.frequency_penalty != 0.0f || a.presence_penalty != 0.0f) {
    for (const auto& [token, n] : c.output_counts()) {
      float& x = at(token);
      x -= a.frequency_penalty * static_cast<float>(n);
      x -= a.presence_penalty;
    }
  }
}

absl::StatusOr<int32_t> ChooseToken(absl::Span<const float> adjusted,
                                    const SamplingConfig& config,
                                    float uniform) {
  const int vocab = static_cast<int>(adjusted.size());
  bool any = false;
  for (float x : adjusted) {
    if (std::isnan(x) || x == kInf) {
      return absl::FailedPreconditionError(
          "non-finite logits: the model produced NaN or inf");
    }
    any = any || x > -kInf;
  }
  if (!any) {
    return absl::FailedPreconditionError(
        "every token is masked: nothing can be chosen");
  }
  if (config.greedy()) return ArgmaxFirst(adjusted.data(), vocab);
  // The filters take finite logits: a masked token stands at the lowest
  // float, whose probability underflows to 0, and is zeroed after.
  std::vector<float> row(adjusted.begin(), adjusted.end());
  std::vector<int32_t> masked;
  for (int i = 0; i < vocab; ++i) {
    if (row[i] == -kInf) {
      row[i] = -kMaxFinite;
      masked.push_back(i);
    }
  }
  std::vector<float> probs;
  if (absl::Status s = FilteredProbs(row.data(), vocab, config, &probs);
      !s.ok()) {
    return s;
  }
  for (int32_t i : masked) probs[i] = 0.0f;
  const int token = SampleIndex(probs, uniform);
  if (token < 0) {
    return absl::FailedPreconditionError(
        "the filters kept only masked tokens: nothing can be chosen");
  }
  return token;
}

}  // namespace specserve::sampling
