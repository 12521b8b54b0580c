// Bounds that both sides of the APIs enforce, defined once so that the
// scheduler, the worker and their messages cannot disagree: the scheduler
// refuses a public request past them (scheduler/request_validation.h), the
// worker sizes its sessions by them and refuses a call past them
// (worker/burst_request.h, spec::SpecEngine::Admit). Header-only; both
// processes depend on proto/, so neither depends on the other for it.
#ifndef SPECSERVE_PROTO_API_LIMITS_H_
#define SPECSERVE_PROTO_API_LIMITS_H_

#include <cstddef>

namespace specserve {

// The deepest speculative round: k drafts, verified as k + 1 columns.
// specserve.v1 SpeculationParams.k, and specserve.worker.v1 BurstRequest.k
// and AdmitRequest.draft_depth, are at most this (INVALID_ARGUMENT naming
// it otherwise). A speculative session's verify captures hold up to
// kMaxDraftDepth + 1 columns, so every accepted k fits every session sized
// for it.
inline constexpr int kMaxDraftDepth = 8;

// The logit controls' bounds (vLLM's, and OpenAI's for biases):
// SamplingParams.presence_penalty and frequency_penalty in
// [-kMaxAbsPenalty, kMaxAbsPenalty]; logit_bias values in
// [-kMaxAbsLogitBias, kMaxAbsLogitBias], on at most kMaxLogitBias tokens.
// The worker's engine checks the same numbers (kernels/sampling/
// logit_adjust.h; worker/burst_request.cc asserts they agree).
inline constexpr float kMaxAbsPenalty = 2.0f;
inline constexpr float kMaxAbsLogitBias = 100.0f;
inline constexpr int kMaxLogitBias = 1024;

// The most bytes of grammar text one StructuredOutput may carry (the schema,
// the regex, the EBNF, or all choices together): the worker compiles it, at
// a cost that grows with the text. The scheduler refuses more; the worker's
// compiler (worker/grammar) checks the same bound.
inline constexpr size_t kMaxGrammarTextBytes = 64 * 1024;

}  // namespace specserve

#endif  // SPECSERVE_PROTO_API_LIMITS_H_
