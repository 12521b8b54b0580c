// Validation of public Generate requests, split by what each check needs
// (docs/DESIGN.md §5, docs/RELIABILITY.md rows 6 and 7):
//
//   1. ValidateGenerateRequest: everything decidable from the request alone —
//      run at admission, before tokenizing, so malformed or oversized requests
//      are refused cheaply and never reach a worker.
//   2. ValidatePromptLength: after tokenizing, prompt + max_tokens against the
//      model context (INVALID_ARGUMENT).
//   3. ValidateSessionTurn: once the session is known, committed + suffix +
//      max_tokens against the session capacity (OUT_OF_RANGE).
//
// Every message names the offending field and value and says what is allowed,
// so a user can fix the request without reading the server's source.
#ifndef SPECSERVE_SCHEDULER_REQUEST_VALIDATION_H_
#define SPECSERVE_SCHEDULER_REQUEST_VALIDATION_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/api_limits.h"
#include "proto/specserve.pb.h"

namespace specserve::scheduler {

// Bounds a request must respect. vocab_size and max_context come from the
// model (ModelInfo); the rest are server policy. speculation.k is bounded by
// kMaxDraftDepth (proto/api_limits.h), which the workers size sessions by:
// not a policy a Limits could change.
struct Limits {
  uint32_t vocab_size = 0;   // ids must be < vocab_size
  uint32_t max_context = 0;  // model context, rows
  // response.logprobs and response.prompt_logprobs in 0..max_logprobs (the
  // worker's spec::kMaxTopLogprobs).
  uint32_t max_logprobs = 20;
  uint32_t max_stop_strings = 16;
  size_t max_stop_len = 256;  // bytes per stop string
  uint32_t max_stop_token_ids = 64;
  // sampling.logit_bias entries (kMaxLogitBias, proto/api_limits.h, is the
  // most the workers take).
  uint32_t max_logit_bias = kMaxLogitBias;
  // Largest text input in bytes: a request-size bound checked before
  // tokenizing (the token bound needs the tokenizer: ValidatePromptLength).
  size_t max_text_bytes = 8 << 20;
  size_t max_session_id_len = 128;
  size_t max_request_id_len = 128;
};

// A structured_output has a kind, at most kMaxGrammarTextBytes of grammar
// text (proto/api_limits.h) and, for choice, at least one value. Whether the
// grammar parses is the worker's check (it compiles it before the burst
// touches the session).
absl::Status ValidateStructuredOutput(const v1::StructuredOutput& s);

// Checks that need no tokenizer and no session state. With token ids as
// input, it also checks prompt + max_tokens against the model context (the
// prompt length is known). Returns INVALID_ARGUMENT naming the first problem.
absl::Status ValidateGenerateRequest(const specserve::v1::GenerateRequest& req,
                                     const Limits& limits);

// Whether the request continues an existing session (a session id is given),
// the only case where an empty input is allowed.
bool IsSessionContinuation(const specserve::v1::GenerateRequest& req);

// The smallest capacity a session may have: one prompt token plus one
// speculative round at the largest draft depth (kMaxDraftDepth drafts and
// the bonus token), kMaxDraftDepth + 2 rows.
uint32_t MinSessionCapacity();

// A capacity to open a session with (`field` names it in the message): 0
// (the server's default) or MinSessionCapacity..max_context; otherwise
// INVALID_ARGUMENT.
absl::Status ValidateSessionCapacity(uint32_t capacity, const Limits& limits,
                                     absl::string_view field);

// After tokenizing: `prompt_tokens` (this turn's new tokens) + `max_tokens`
// must fit the model context. max_tokens == 0 ("up to the limit") only needs
// the prompt itself to fit. INVALID_ARGUMENT
// "prompt (N tokens) + max_tokens (M) exceeds the model context (C)".
absl::Status ValidatePromptLength(uint64_t prompt_tokens, uint32_t max_tokens,
                                  const Limits& limits);

// A session turn: `committed` rows already in the session (counting a carried
// pending token, which takes a row when flushed; after a REWIND, the rewind
// position), `suffix_tokens` new input, up to `max_tokens` to generate
// (0 = until full), in a session of `capacity` rows. OUT_OF_RANGE with
// committed and capacity in the message when it cannot fit.
absl::Status ValidateSessionTurn(uint64_t committed, uint64_t suffix_tokens,
                                 uint32_t max_tokens, uint32_t capacity);

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_REQUEST_VALIDATION_H_
