// Translates the gateway's vllm.grpc.engine.GenerateRequest into the
// specserve.v1.GenerateRequest that RunGenerateCall runs (one-shot: no
// session is kept), and refuses every field specserve cannot honour with a
// status whose message names the field (proto path) — nothing is silently
// ignored:
//   INVALID_ARGUMENT  n over kMaxSamples, penalties outside vLLM's bounds
//   (frequency
//                     and presence in [-2, 2], repetition > 0), logit_bias
//                     on ids outside the vocabulary or biases outside
//                     [-100, 100] (at most 1024 entries), min_tokens over
//                     max_tokens, logprobs / prompt_logprobs outside 0..20
//                     (vLLM's -1, "all", included), max_tokens 0, a
//                     data_parallel_rank other than 0,
//                     truncate_prompt_tokens on text input
//   UNIMPLEMENTED     structural tags, multimodal inputs, KV transfer
// Mapped: tokenized input (or text), temperature (unset = 1.0, as vLLM),
// top_p (0 = 1), top_k (0 = off), min_p, frequency / presence /
// repetition penalties (repetition 0 = unset = 1), logit_bias, seed,
// max_tokens (unset = up to the context), min_tokens, stop,
// stop_token_ids, ignore_eos, truncate_prompt_tokens, logprobs and
// prompt_logprobs (specserve.v1 ResponseOptions), the constraints
// json_schema, regex, grammar (EBNF), json_object and choice
// (structured_output), n (SampleRequest), the request id
// (Admin.Abort and VllmEngine.Abort find it). Speculation comes from the
// scheduler's gateway options, not the request. The response carries token
// ids only (the gateway detokenizes), so the text options
// skip_special_tokens, spaces_between_special_tokens and
// include_stop_str_in_output do not change it: the ids include the token that
// completed a stop string either way, and the EOS or stop token id that
// ended the output (ResponseOptions.include_stop_token), as vLLM's do.
#ifndef SPECSERVE_SCHEDULER_VLLM_ENGINE_REQUEST_TRANSLATOR_H_
#define SPECSERVE_SCHEDULER_VLLM_ENGINE_REQUEST_TRANSLATOR_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "proto/specserve.pb.h"
#include "scheduler/request_validation.h"
#include "vllm_engine.pb.h"

namespace specserve::scheduler::vllm_engine {

// How the scheduler runs gateway requests (--gateway_speculation,
// --gateway_k): the vLLM protocol has no field for it.
struct GatewayOptions {
  bool speculation = true;
  // Draft depth; 0 = the scheduler's --default_k.
  uint32_t k = 0;
};

// The most samples one request may ask for (SamplingParams.n).
inline constexpr uint32_t kMaxSamples = 16;

struct TranslatedRequest {
  // One-shot, so its output ends at max_tokens with no overshoot, as
  // vLLM's contract is (BurstRequest.max_emit).
  specserve::v1::GenerateRequest request;
  bool stream = false;
  // Prompt tokens when the input is tokenized (after truncation), else 0.
  uint32_t prompt_tokens = 0;
  // The first prompt token, when the input is tokenized: the entry without
  // a logprob that vLLM's prompt logprobs begin with.
  std::optional<uint32_t> first_prompt_id;
  // SamplingParams.n (0 read as 1): the samples to run, each `request` with
  // its own seed and request id (SampleRequest).
  uint32_t samples = 1;
};

// Sample `index` of a request of n > 1 samples: its own request id
// ("<id>#<index>", VllmEngine.Abort of the id reaches every sample) and seed
// stream (the request's seed + index, so each sample is reproducible by the
// request's seed; unset stays unset: each picks a fresh seed).
specserve::v1::GenerateRequest SampleRequest(
    const specserve::v1::GenerateRequest& request, uint32_t index);

// `limits`: the current model's (truncate_prompt_tokens = -1 keeps the last
// max_context tokens).
absl::StatusOr<TranslatedRequest> TranslateGenerateRequest(
    const ::vllm::grpc::engine::GenerateRequest& in,
    const GatewayOptions& options, const Limits& limits);

// The specserve.v1 seed for a vLLM seed: every int32 (0 included, which
// specserve reads as "pick one") maps to its own nonzero seed.
uint64_t SpecserveSeed(int32_t vllm_seed);

}  // namespace specserve::scheduler::vllm_engine

#endif  // SPECSERVE_SCHEDULER_VLLM_ENGINE_REQUEST_TRANSLATOR_H_
