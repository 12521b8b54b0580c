#include "scheduler/request_validation.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "telemetry/status_macros.h"

namespace specserve::scheduler {
namespace {

namespace v1 = specserve::v1;

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

absl::Status ValidateInput(const v1::GenerateRequest& req,
                           const Limits& limits) {
  const bool continuation = IsSessionContinuation(req);
  const char* const kEmptyHint =
      "; an empty input is allowed only to continue an existing session "
      "(session.session_id set)";
  switch (req.input_case()) {
    case v1::GenerateRequest::INPUT_NOT_SET:
      if (!continuation) {
        return Invalid(absl::StrCat("input is missing: give text or token_ids",
                                    kEmptyHint));
      }
      return absl::OkStatus();
    case v1::GenerateRequest::kText:
      if (req.text().empty() && !continuation) {
        return Invalid(absl::StrCat("input text is empty", kEmptyHint));
      }
      if (req.text().size() > limits.max_text_bytes) {
        return Invalid(absl::StrCat("input text is ", req.text().size(),
                                    " bytes; the limit is ",
                                    limits.max_text_bytes, " bytes"));
      }
      return absl::OkStatus();
    case v1::GenerateRequest::kTokenIds: {
      const auto& ids = req.token_ids().ids();
      if (ids.empty() && !continuation) {
        return Invalid(absl::StrCat("input token_ids is empty", kEmptyHint));
      }
      for (int i = 0; i < ids.size(); ++i) {
        if (ids[i] >= limits.vocab_size) {
          return Invalid(
              absl::StrCat("token_ids[", i, "] = ", ids[i],
                           " is outside the vocabulary (ids must be < ",
                           limits.vocab_size, ")"));
        }
      }
      return absl::OkStatus();
    }
  }
  return Invalid("input: unknown input kind");
}

// vLLM's bounds (proto/api_limits.h). NaN fails every comparison below.
absl::Status ValidateLogitControls(const v1::SamplingParams& s,
                                   const Limits& limits) {
  for (const auto& [field, value] :
       {std::make_pair("sampling.presence_penalty", s.presence_penalty()),
        std::make_pair("sampling.frequency_penalty", s.frequency_penalty())}) {
    if (!(std::fabs(value) <= kMaxAbsPenalty)) {
      return Invalid(absl::StrCat(field, " = ", value,
                                  "; it must be in [-2, 2] (0 = off)"));
    }
  }
  if (!(s.repetition_penalty() >= 0) ||
      !std::isfinite(s.repetition_penalty())) {
    return Invalid(
        absl::StrCat("sampling.repetition_penalty = ", s.repetition_penalty(),
                     "; it must be finite and > 0 (1 or unset = off)"));
  }
  if (s.logit_bias_size() > static_cast<int>(limits.max_logit_bias)) {
    return Invalid(absl::StrCat("sampling.logit_bias has ", s.logit_bias_size(),
                                " entries; at most ", limits.max_logit_bias,
                                " are allowed"));
  }
  for (const auto& [id, bias] : s.logit_bias()) {
    if (id >= limits.vocab_size) {
      return Invalid(absl::StrCat("sampling.logit_bias: token id ", id,
                                  " is outside the vocabulary (ids must be < ",
                                  limits.vocab_size, ")"));
    }
    if (!(std::fabs(bias) <= kMaxAbsLogitBias)) {
      return Invalid(absl::StrCat("sampling.logit_bias[", id, "] = ", bias,
                                  "; a bias must be in [-100, 100]"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateSampling(const v1::SamplingParams& s,
                              const Limits& limits) {
  if (!std::isfinite(s.temperature()) || s.temperature() < 0) {
    return Invalid(absl::StrCat("sampling.temperature = ", s.temperature(),
                                "; it must be finite and >= 0 (0 = greedy)"));
  }
  // top_p: 0 means unset (read as 1); otherwise (0, 1]. NaN fails both tests.
  if (!(s.top_p() >= 0 && s.top_p() <= 1)) {
    return Invalid(absl::StrCat("sampling.top_p = ", s.top_p(),
                                "; it must be in (0, 1] (0 or unset = 1)"));
  }
  if (!(s.min_p() >= 0 && s.min_p() < 1)) {
    return Invalid(absl::StrCat("sampling.min_p = ", s.min_p(),
                                "; it must be in [0, 1) (0 = off)"));
  }
  if (s.top_k() > limits.vocab_size) {
    return Invalid(absl::StrCat("sampling.top_k = ", s.top_k(),
                                " exceeds the vocabulary size (",
                                limits.vocab_size, "); use 0 for no top-k"));
  }
  return ValidateLogitControls(s, limits);
}

absl::Status ValidateStopping(const v1::StoppingParams& s,
                              const Limits& limits) {
  if (s.max_tokens() > limits.max_context) {
    return Invalid(absl::StrCat("stopping.max_tokens = ", s.max_tokens(),
                                " exceeds the model context (",
                                limits.max_context,
                                " tokens); use 0 to generate up to the limit"));
  }
  if (s.max_tokens() > 0 && s.min_tokens() > s.max_tokens()) {
    return Invalid(absl::StrCat("stopping.min_tokens = ", s.min_tokens(),
                                " exceeds stopping.max_tokens (",
                                s.max_tokens(), ")"));
  }
  if (s.min_tokens() > limits.max_context) {
    return Invalid(absl::StrCat("stopping.min_tokens = ", s.min_tokens(),
                                " exceeds the model context (",
                                limits.max_context, " tokens)"));
  }
  if (static_cast<uint32_t>(s.stop_size()) > limits.max_stop_strings) {
    return Invalid(absl::StrCat("stopping.stop has ", s.stop_size(),
                                " strings; at most ", limits.max_stop_strings,
                                " are allowed"));
  }
  for (int i = 0; i < s.stop_size(); ++i) {
    if (s.stop(i).empty()) {
      return Invalid(absl::StrCat("stopping.stop[", i, "] is empty"));
    }
    if (s.stop(i).size() > limits.max_stop_len) {
      return Invalid(absl::StrCat("stopping.stop[", i, "] is ",
                                  s.stop(i).size(), " bytes; at most ",
                                  limits.max_stop_len, " are allowed"));
    }
  }
  if (static_cast<uint32_t>(s.stop_token_ids_size()) >
      limits.max_stop_token_ids) {
    return Invalid(absl::StrCat("stopping.stop_token_ids has ",
                                s.stop_token_ids_size(), " ids; at most ",
                                limits.max_stop_token_ids, " are allowed"));
  }
  for (int i = 0; i < s.stop_token_ids_size(); ++i) {
    if (s.stop_token_ids(i) >= limits.vocab_size) {
      return Invalid(absl::StrCat("stopping.stop_token_ids[", i,
                                  "] = ", s.stop_token_ids(i),
                                  " is outside the vocabulary (ids must be < ",
                                  limits.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateResponse(const v1::ResponseOptions& r,
                              const Limits& limits) {
  if (r.has_logprobs() && r.logprobs() > limits.max_logprobs) {
    return Invalid(absl::StrCat("response.logprobs = ", r.logprobs(),
                                "; it must be 0..", limits.max_logprobs,
                                " (top alternatives per token)"));
  }
  if (r.has_prompt_logprobs() && r.prompt_logprobs() > limits.max_logprobs) {
    return Invalid(absl::StrCat(
        "response.prompt_logprobs = ", r.prompt_logprobs(), "; it must be 0..",
        limits.max_logprobs, " (top alternatives per prompt token)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateSessionParams(const v1::GenerateRequest& req,
                                   const Limits& limits) {
  if (!req.has_session()) return absl::OkStatus();
  const v1::SessionTurn& turn = req.session();
  if (turn.session_id().size() > limits.max_session_id_len) {
    return Invalid(absl::StrCat(
        "session.session_id is ", turn.session_id().size(),
        " bytes; session ids are at most ", limits.max_session_id_len));
  }
  if (turn.mode() == v1::SessionTurn::REWIND && turn.session_id().empty()) {
    return Invalid(
        "session.mode REWIND needs session.session_id of an existing session");
  }
  if (turn.mode() != v1::SessionTurn::APPEND &&
      turn.mode() != v1::SessionTurn::REWIND) {
    return Invalid(absl::StrCat("session.mode = ", turn.mode(),
                                " is not a known mode (APPEND or REWIND)"));
  }
  // capacity only applies when this request creates the session; for an
  // existing session it is ignored.
  if (turn.session_id().empty()) {
    return ValidateSessionCapacity(turn.capacity(), limits, "session.capacity");
  }
  return absl::OkStatus();
}

}  // namespace

bool IsSessionContinuation(const v1::GenerateRequest& req) {
  return req.has_session() && !req.session().session_id().empty();
}

absl::Status ValidateStructuredOutput(const v1::StructuredOutput& s) {
  size_t bytes = 0;
  switch (s.kind_case()) {
    case v1::StructuredOutput::kJsonSchema:
      bytes = s.json_schema().size();
      break;
    case v1::StructuredOutput::kRegex:
      bytes = s.regex().size();
      break;
    case v1::StructuredOutput::kEbnf:
      bytes = s.ebnf().size();
      break;
    case v1::StructuredOutput::kChoice:
      if (s.choice().values().empty()) {
        return Invalid("structured_output.choice needs at least one value");
      }
      for (const std::string& v : s.choice().values()) bytes += v.size();
      break;
    case v1::StructuredOutput::kJsonObject:
      break;
    case v1::StructuredOutput::KIND_NOT_SET:
      return Invalid(
          "structured_output has no kind: set json_schema, regex, ebnf, "
          "choice or json_object");
  }
  if (bytes > kMaxGrammarTextBytes) {
    return Invalid(absl::StrCat("structured_output grammar text is ", bytes,
                                " bytes, over the limit ",
                                kMaxGrammarTextBytes));
  }
  return absl::OkStatus();
}

absl::Status ValidateGenerateRequest(const v1::GenerateRequest& req,
                                     const Limits& limits) {
  if (req.request_id().size() > limits.max_request_id_len) {
    return Invalid(absl::StrCat("request_id is ", req.request_id().size(),
                                " bytes; at most ", limits.max_request_id_len,
                                " are allowed"));
  }
  SS_RETURN_IF_ERROR(ValidateInput(req, limits));
  SS_RETURN_IF_ERROR(ValidateSampling(req.sampling(), limits));
  SS_RETURN_IF_ERROR(ValidateStopping(req.stopping(), limits));
  if (const uint32_t k = req.speculation().k();
      k > static_cast<uint32_t>(kMaxDraftDepth)) {
    return Invalid(
        absl::StrCat("speculation.k ", k, " is over the limit ", kMaxDraftDepth,
                     " (the deepest speculative round); use 1..",
                     kMaxDraftDepth, ", or 0 for the server's default"));
  }
  SS_RETURN_IF_ERROR(ValidateResponse(req.response(), limits));
  if (req.has_structured_output()) {
    SS_RETURN_IF_ERROR(ValidateStructuredOutput(req.structured_output()));
  }
  SS_RETURN_IF_ERROR(ValidateSessionParams(req, limits));
  if (req.input_case() == v1::GenerateRequest::kTokenIds) {
    SS_RETURN_IF_ERROR(ValidatePromptLength(
        req.token_ids().ids_size(), req.stopping().max_tokens(), limits));
  }
  return absl::OkStatus();
}

uint32_t MinSessionCapacity() { return kMaxDraftDepth + 2; }

absl::Status ValidateSessionCapacity(uint32_t capacity, const Limits& limits,
                                     absl::string_view field) {
  if (capacity > limits.max_context) {
    return Invalid(absl::StrCat(field, " = ", capacity,
                                " exceeds the model context (",
                                limits.max_context, ")"));
  }
  if (capacity != 0 && capacity < MinSessionCapacity()) {
    return Invalid(absl::StrCat(
        field, " = ", capacity, " is below the minimum of ",
        MinSessionCapacity(),
        " rows (one prompt token and one round at the largest draft depth, ",
        kMaxDraftDepth, "); use 0 for the server's default"));
  }
  return absl::OkStatus();
}

absl::Status ValidatePromptLength(uint64_t prompt_tokens, uint32_t max_tokens,
                                  const Limits& limits) {
  if (prompt_tokens + max_tokens <= limits.max_context) {
    return absl::OkStatus();
  }
  if (max_tokens == 0) {
    return Invalid(absl::StrCat("prompt (", prompt_tokens,
                                " tokens) exceeds the model context (",
                                limits.max_context, ")"));
  }
  return Invalid(absl::StrCat(
      "prompt (", prompt_tokens, " tokens) + max_tokens (", max_tokens,
      ") exceeds the model context (", limits.max_context, ")"));
}

absl::Status ValidateSessionTurn(uint64_t committed, uint64_t suffix_tokens,
                                 uint32_t max_tokens, uint32_t capacity) {
  const uint64_t needed = committed + suffix_tokens + max_tokens;
  if (needed <= capacity) return absl::OkStatus();
  const uint64_t used = committed + suffix_tokens;
  std::string hint;
  if (used < capacity && max_tokens > 0) {
    hint = absl::StrCat("; lower max_tokens to at most ", capacity - used,
                        ", or open a session with a larger capacity");
  } else {
    hint = "; open a new session (with a larger capacity) for this turn";
  }
  return absl::OutOfRangeError(absl::StrCat(
      "session turn does not fit: committed ", committed, " + input ",
      suffix_tokens, " + max_tokens ", max_tokens, " = ", needed,
      " rows exceeds the session capacity ", capacity, hint));
}

}  // namespace specserve::scheduler
