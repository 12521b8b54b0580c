#include "worker/burst_request.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/sampling/logit_adjust.h"
#include "kernels/sampling/sampling.h"
#include "telemetry/status_macros.h"

namespace specserve::worker {

static_assert(kMaxAbsPenalty == sampling::kMaxAbsPenalty &&
                  kMaxAbsLogitBias == sampling::kMaxAbsLogitBias &&
                  kMaxLogitBias == sampling::kMaxLogitBias,
              "the scheduler and the engine bound the logit controls alike");

absl::Status CheckBurstLimits(const specserve::worker::v1::BurstRequest& r) {
  if (r.max_new() == 0 || r.max_new() > static_cast<uint32_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("max_new must be in 1..2147483647");
  }
  if (r.has_max_emit() && (r.max_emit() < r.max_new() ||
                           r.max_emit() > static_cast<uint32_t>(INT32_MAX))) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_emit ", r.max_emit(), " must be in max_new (",
                     r.max_new(), ")..2147483647"));
  }
  if (r.k() > static_cast<uint32_t>(kMaxDraftDepth)) {
    return absl::InvalidArgumentError(
        absl::StrCat("k ", r.k(), " is over the limit ", kMaxDraftDepth,
                     " (the deepest speculative round)"));
  }
  const uint32_t most = spec::kMaxTopLogprobs;
  if (r.has_logprobs() && r.logprobs() > most) {
    return absl::InvalidArgumentError(
        absl::StrCat("logprobs = ", r.logprobs(),
                     " exceeds the most alternatives (", most, ")"));
  }
  if (r.has_prompt_logprobs() && r.prompt_logprobs() > most) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt_logprobs = ", r.prompt_logprobs(),
                     " exceeds the most alternatives (", most, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckAdmitLimits(const specserve::worker::v1::AdmitRequest& r) {
  if (r.draft_depth() > static_cast<uint32_t>(kMaxDraftDepth)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft_depth ", r.draft_depth(), " is over the limit ", kMaxDraftDepth,
        " (the deepest speculative round; 0 = the limit)"));
  }
  return absl::OkStatus();
}

int DraftDepthOf(const specserve::worker::v1::AdmitRequest& r) {
  return r.draft_depth() > 0 ? static_cast<int>(r.draft_depth())
                             : kMaxDraftDepth;
}

absl::StatusOr<grammar::GrammarSpec> GrammarSpecOf(
    const specserve::v1::StructuredOutput& s) {
  using specserve::v1::StructuredOutput;
  grammar::GrammarSpec spec;
  switch (s.kind_case()) {
    case StructuredOutput::kJsonSchema:
      spec.kind = grammar::GrammarKind::kJsonSchema;
      spec.text = s.json_schema();
      break;
    case StructuredOutput::kRegex:
      spec.kind = grammar::GrammarKind::kRegex;
      spec.text = s.regex();
      break;
    case StructuredOutput::kEbnf:
      spec.kind = grammar::GrammarKind::kEbnf;
      spec.text = s.ebnf();
      break;
    case StructuredOutput::kChoice:
      spec.kind = grammar::GrammarKind::kChoice;
      spec.choices.assign(s.choice().values().begin(),
                          s.choice().values().end());
      break;
    case StructuredOutput::kJsonObject:
      spec.kind = grammar::GrammarKind::kJsonObject;
      break;
    case StructuredOutput::KIND_NOT_SET:
      return absl::InvalidArgumentError(
          "structured_output has no kind: set json_schema, regex, ebnf, "
          "choice or json_object");
  }
  return spec;
}

absl::StatusOr<spec::BurstParams> BurstParamsOf(
    const specserve::worker::v1::BurstRequest& r, bool fault_injection,
    grammar::GrammarCompiler* grammars) {
  const specserve::v1::SamplingParams& s = r.sampling();
  spec::BurstParams p;
  p.sampling.temperature = s.temperature();
  p.sampling.top_k = static_cast<int>(s.top_k());
  p.sampling.top_p = s.top_p() == 0.0f ? 1.0f : s.top_p();
  p.sampling.min_p = s.min_p();
  SS_RETURN_IF_ERROR(sampling::ValidateSamplingConfig(p.sampling));
  p.suffix.assign(r.suffix().begin(), r.suffix().end());
  p.rewind = r.rewind();
  p.max_new = static_cast<int>(r.max_new());
  if (r.has_max_emit()) p.max_emit = static_cast<int>(r.max_emit());
  p.k = static_cast<int>(r.k());
  p.seed = s.seed();
  p.stop_ids.assign(r.stop_token_ids().begin(), r.stop_token_ids().end());
  // Ranges and ids are the engine's checks (it knows the vocabulary):
  // ids past INT32_MAX turn negative here and are refused there.
  sampling::LogitAdjustments& a = p.adjust;
  a.presence_penalty = s.presence_penalty();
  a.frequency_penalty = s.frequency_penalty();
  a.repetition_penalty =
      s.repetition_penalty() == 0.0f ? 1.0f : s.repetition_penalty();
  for (const auto& [id, bias] : s.logit_bias()) {
    a.logit_bias.emplace_back(static_cast<int32_t>(id), bias);
  }
  std::sort(a.logit_bias.begin(), a.logit_bias.end());
  a.min_tokens = static_cast<int>(
      std::min<uint32_t>(r.min_tokens(), static_cast<uint32_t>(INT32_MAX)));
  if (a.min_tokens > 0) a.stop_ids = p.stop_ids;
  p.prior_output = static_cast<int>(std::min<uint32_t>(
      r.prior_output_tokens(), static_cast<uint32_t>(INT32_MAX)));
  if (r.has_logprobs()) p.logprobs = static_cast<int>(r.logprobs());
  if (r.has_prompt_logprobs()) {
    p.prompt_logprobs = static_cast<int>(r.prompt_logprobs());
  }
  if (fault_injection) p.inject_nan_at = static_cast<int>(r.inject_nan_at());
  if (r.has_structured_output()) {
    if (grammars == nullptr) {
      return absl::UnimplementedError(
          "structured_output: this worker's model directory has no usable "
          "tokenizer.json, which constrained decoding needs");
    }
    SS_ASSIGN_OR_RETURN(grammar::GrammarSpec spec,
                        GrammarSpecOf(r.structured_output()));
    absl::StatusOr<grammar::CompiledGrammar> compiled = grammars->Compile(spec);
    if (!compiled.ok()) {
      return absl::Status(
          compiled.status().code(),
          absl::StrCat("structured_output.", GrammarKindName(spec.kind), ": ",
                       compiled.status().message()));
    }
    p.grammar = std::move(*compiled);
  }
  return p;
}

}  // namespace specserve::worker
