#include "scheduler/vllm_engine/request_translator.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "proto/api_limits.h"
#include "telemetry/status_macros.h"

namespace specserve::scheduler::vllm_engine {
namespace {

namespace vproto = ::vllm::grpc::engine;

absl::Status Refuse(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

absl::Status Unimplemented(absl::string_view field, absl::string_view why) {
  return absl::UnimplementedError(absl::StrCat(field, ": ", why));
}

absl::Status CheckUnsupported(const vproto::GenerateRequest& in) {
  if (in.has_mm_inputs() || in.extra_mm_inputs_size() > 0) {
    return Unimplemented(in.has_mm_inputs() ? "mm_inputs" : "extra_mm_inputs",
                         "multimodal inputs are not supported: specserve "
                         "serves text-only models; send text or token ids");
  }
  if (in.has_media_refs()) {
    return Unimplemented("media_refs",
                         "multimodal inputs are not supported: specserve "
                         "serves text-only models; send text or token ids");
  }
  if (in.has_kv_transfer_params() || in.has_kv_transfer_params_json()) {
    return Unimplemented(
        in.has_kv_transfer_params() ? "kv_transfer_params"
                                    : "kv_transfer_params_json",
        "KV transfer (prefill/decode disaggregation) is not supported: send "
        "the whole request to one specserve scheduler");
  }
  if (in.has_data_parallel_rank() && in.data_parallel_rank() != 0) {
    return Refuse("data_parallel_rank",
                  absl::StrCat("is ", in.data_parallel_rank(),
                               "; this server has one rank (0): GetServerInfo "
                               "reports data_parallel_size 1"));
  }
  const vproto::SamplingParams& p = in.sampling_params();
  if (p.n() > kMaxSamples) {
    return Refuse("sampling_params.n",
                  absl::StrCat("is ", p.n(), "; give 1..", kMaxSamples,
                               " samples per request"));
  }
  if (p.constraint_case() == vproto::SamplingParams::kStructuralTag) {
    return Unimplemented("sampling_params.structural_tag",
                         "structural tags are not supported: send a "
                         "json_schema, regex, grammar, choice or json_object "
                         "constraint");
  }
  return absl::OkStatus();
}

// Penalties, logit_bias: vLLM's bounds, named by this protocol's fields
// (ValidateGenerateRequest checks the translation again).
absl::Status TranslateLogitControls(const vproto::SamplingParams& p,
                                    const Limits& limits,
                                    specserve::v1::SamplingParams* s) {
  for (const auto& [field, value] :
       {std::make_pair("sampling_params.frequency_penalty",
                       p.frequency_penalty()),
        std::make_pair("sampling_params.presence_penalty",
                       p.presence_penalty())}) {
    if (!(std::fabs(value) <= kMaxAbsPenalty)) {  // NaN too
      return Refuse(field,
                    absl::StrCat("is ", value, "; give a penalty in [-2, 2]"));
    }
  }
  // 0 is proto3's unset, which vLLM reads as 1 (no penalty).
  if (!(p.repetition_penalty() >= 0.0f) ||
      !std::isfinite(p.repetition_penalty())) {
    return Refuse("sampling_params.repetition_penalty",
                  absl::StrCat("is ", p.repetition_penalty(),
                               "; give a finite penalty > 0 (1 = none)"));
  }
  s->set_frequency_penalty(p.frequency_penalty());
  s->set_presence_penalty(p.presence_penalty());
  s->set_repetition_penalty(p.repetition_penalty());
  if (p.logit_bias_size() > static_cast<int>(limits.max_logit_bias)) {
    return Refuse(
        "sampling_params.logit_bias",
        absl::StrCat("has ", p.logit_bias_size(), " entries; at most ",
                     limits.max_logit_bias, " are allowed"));
  }
  for (const auto& [id, bias] : p.logit_bias()) {
    if (id < 0 || static_cast<uint32_t>(id) >= limits.vocab_size) {
      return Refuse("sampling_params.logit_bias",
                    absl::StrCat("token id ", id,
                                 " is outside the vocabulary (ids must be < ",
                                 limits.vocab_size, ")"));
    }
    if (!(std::fabs(bias) <= kMaxAbsLogitBias)) {
      return Refuse("sampling_params.logit_bias",
                    absl::StrCat("the bias of token ", id, " is ", bias,
                                 "; give a bias in [-100, 100]"));
    }
    (*s->mutable_logit_bias())[static_cast<uint32_t>(id)] = bias;
  }
  return absl::OkStatus();
}

// The constraint as specserve.v1's structured_output (grammar is EBNF in
// both); its checks are ValidateGenerateRequest's and the worker's compile.
void TranslateConstraint(const vproto::SamplingParams& p,
                         specserve::v1::GenerateRequest* r) {
  switch (p.constraint_case()) {
    case vproto::SamplingParams::kJsonSchema:
      r->mutable_structured_output()->set_json_schema(p.json_schema());
      break;
    case vproto::SamplingParams::kRegex:
      r->mutable_structured_output()->set_regex(p.regex());
      break;
    case vproto::SamplingParams::kGrammar:
      r->mutable_structured_output()->set_ebnf(p.grammar());
      break;
    case vproto::SamplingParams::kJsonObject:
      if (p.json_object())
        r->mutable_structured_output()->set_json_object(true);
      break;
    case vproto::SamplingParams::kChoice:
      // An empty list stays a choice: ValidateStructuredOutput refuses it.
      r->mutable_structured_output()->mutable_choice()->mutable_values()->Add(
          p.choice().choices().begin(), p.choice().choices().end());
      break;
    case vproto::SamplingParams::kStructuralTag:  // refused before
    case vproto::SamplingParams::CONSTRAINT_NOT_SET:
      break;
  }
}

}  // namespace

specserve::v1::GenerateRequest SampleRequest(
    const specserve::v1::GenerateRequest& request, uint32_t index) {
  specserve::v1::GenerateRequest r = request;
  r.set_request_id(absl::StrCat(request.request_id(), "#", index));
  // SpecserveSeed sets bit 32, so a seed plus an index below 2^32 stays
  // nonzero and distinct per (vLLM seed, index).
  if (r.sampling().seed() != 0) {
    r.mutable_sampling()->set_seed(request.sampling().seed() +
                                   (uint64_t{index} << 33));
  }
  return r;
}

uint64_t SpecserveSeed(int32_t vllm_seed) {
  return (uint64_t{1} << 32) | static_cast<uint32_t>(vllm_seed);
}

absl::StatusOr<TranslatedRequest> TranslateGenerateRequest(
    const vproto::GenerateRequest& in, const GatewayOptions& options,
    const Limits& limits) {
  if (absl::Status s = CheckUnsupported(in); !s.ok()) return s;
  const vproto::SamplingParams& p = in.sampling_params();
  // vLLM's -1 ("every token of the vocabulary") has no specserve.v1
  // counterpart.
  for (const auto& [field, set, n] :
       {std::make_tuple("sampling_params.logprobs", p.has_logprobs(),
                        p.logprobs()),
        std::make_tuple("sampling_params.prompt_logprobs",
                        p.has_prompt_logprobs(), p.prompt_logprobs())}) {
    if (set && (n < 0 || static_cast<uint32_t>(n) > limits.max_logprobs)) {
      return Refuse(field,
                    absl::StrCat("is ", n, "; give 0..", limits.max_logprobs,
                                 " top alternatives per token"));
    }
  }
  TranslatedRequest out;
  specserve::v1::GenerateRequest& r = out.request;
  r.set_request_id(in.request_id());

  switch (in.input_case()) {
    case vproto::GenerateRequest::kTokenized: {
      const auto& ids = in.tokenized().input_ids();
      int begin = 0;
      if (p.has_truncate_prompt_tokens()) {
        const int32_t keep = p.truncate_prompt_tokens();
        if (keep == 0 || keep < -1) {
          return Refuse("sampling_params.truncate_prompt_tokens",
                        absl::StrCat("is ", keep,
                                     "; give N > 0 (keep the last N prompt "
                                     "tokens) or -1 (the model context)"));
        }
        const int64_t n = keep == -1 ? limits.max_context : keep;
        if (ids.size() > n) begin = static_cast<int>(ids.size() - n);
      }
      for (int i = begin; i < ids.size(); ++i) {
        r.mutable_token_ids()->add_ids(ids[i]);
      }
      out.prompt_tokens = static_cast<uint32_t>(ids.size() - begin);
      if (begin < ids.size()) out.first_prompt_id = ids[begin];
      break;
    }
    case vproto::GenerateRequest::kText:
      if (p.has_truncate_prompt_tokens()) {
        return Refuse("sampling_params.truncate_prompt_tokens",
                      "needs tokenized input: send input_ids");
      }
      r.set_text(in.text());
      break;
    case vproto::GenerateRequest::INPUT_NOT_SET:
      return Refuse("input", "give tokenized.input_ids or text");
  }

  specserve::v1::SamplingParams* s = r.mutable_sampling();
  s->set_temperature(p.has_temperature() ? p.temperature() : 1.0f);
  s->set_top_p(p.top_p());
  s->set_top_k(p.top_k());
  s->set_min_p(p.min_p());
  if (p.has_seed()) s->set_seed(SpecserveSeed(p.seed()));
  SS_RETURN_IF_ERROR(TranslateLogitControls(p, limits, s));
  TranslateConstraint(p, &r);

  specserve::v1::StoppingParams* stop = r.mutable_stopping();
  if (p.has_max_tokens()) {
    if (p.max_tokens() == 0) {
      return Refuse("sampling_params.max_tokens",
                    "is 0; give at least 1, or leave it unset for up to the "
                    "model context");
    }
    stop->set_max_tokens(p.max_tokens());
  }
  for (const std::string& str : p.stop()) stop->add_stop(str);
  for (uint32_t id : p.stop_token_ids()) stop->add_stop_token_ids(id);
  stop->set_ignore_eos(p.ignore_eos());
  if (p.min_tokens() > 0 && p.has_max_tokens() &&
      p.min_tokens() > p.max_tokens()) {
    return Refuse(
        "sampling_params.min_tokens",
        absl::StrCat("is ", p.min_tokens(), "; it must be at most max_tokens (",
                     p.max_tokens(), ")"));
  }
  stop->set_min_tokens(p.min_tokens());

  r.mutable_speculation()->set_enable(options.speculation);
  r.mutable_speculation()->set_k(options.k);
  r.mutable_response()->set_ids(true);
  r.mutable_response()->set_text(false);
  r.mutable_response()->set_spec_stats(true);
  // As vLLM: the EOS or stop token id that ends the output is its last id
  // (the gateway keeps it out of the text).
  r.mutable_response()->set_include_stop_token(true);
  // Counts above the limit are refused by ValidateGenerateRequest, naming
  // response.logprobs / response.prompt_logprobs.
  if (p.has_logprobs()) r.mutable_response()->set_logprobs(p.logprobs());
  if (p.has_prompt_logprobs()) {
    r.mutable_response()->set_prompt_logprobs(p.prompt_logprobs());
  }
  out.stream = in.stream();
  out.samples = std::max<uint32_t>(1, p.n());
  return out;
}

}  // namespace specserve::scheduler::vllm_engine
