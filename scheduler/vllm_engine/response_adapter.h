// Turns the specserve.v1 GenerateEvents of one request into the gateway's
// vllm.grpc.engine.GenerateResponse messages, as vLLM's own servicer sends
// them: a WriterInterface<GenerateEvent>, so RunGenerateCall writes to it
// through a GenerateWriter as it writes to a specserve.v1 client.
//   stream: one chunk per delta (its token ids, completion_tokens = their
//     count: the gateway adds them up), then one complete with the finish
//     reason and usage and no ids (the chunks carried them).
//   not stream: nothing until the final event, then one complete with every
//     output id.
// Invariants: the ids sent are exactly the ids specserve showed, which for
// the one-shot requests of this protocol end at max_tokens, as vLLM's do (a
// one-shot request's rounds never commit past it: BurstRequest.max_emit);
// completion_tokens counts the ids sent. Finish reasons: STOP "stop", LENGTH
// and CONTEXT_FULL "length", CANCELLED (Abort, drain) "abort"; what stopped
// it goes in the complete's matched_stop (matched_token_id: the stop token
// or EOS, the last id sent; matched_stop_str: the stop string).
// Logprobs (when the request asked for them): each chunk carries those of
// its ids (output_logprobs), a non-streaming complete those of all its ids.
// Prompt logprobs are known only at the final event, so they go in the
// complete, streaming or not (vLLM sends them in the first chunk): as vLLM's,
// they begin with the prompt's first token, which has no logprob.
#ifndef SPECSERVE_SCHEDULER_VLLM_ENGINE_RESPONSE_ADAPTER_H_
#define SPECSERVE_SCHEDULER_VLLM_ENGINE_RESPONSE_ADAPTER_H_

#include <cstdint>
#include <optional>

#include "grpcpp/grpcpp.h"
#include "grpcpp/support/sync_stream.h"
#include "proto/specserve.pb.h"
#include "vllm_engine.pb.h"

namespace specserve::scheduler::vllm_engine {

class ResponseAdapter final
    : public grpc::internal::WriterInterface<specserve::v1::GenerateEvent> {
 public:
  // `out` must outlive the adapter. `prompt_tokens`: the chunks' prompt
  // count until the final event gives the real one (0 when not known).
  ResponseAdapter(grpc::internal::WriterInterface<
                      ::vllm::grpc::engine::GenerateResponse>* out,
                  bool stream, uint32_t prompt_tokens,
                  std::optional<uint32_t> first_prompt_id = std::nullopt);

  // False once the gateway's stream is closed.
  bool Write(const specserve::v1::GenerateEvent& event,
             grpc::WriteOptions options) override;

  // Whether the complete message was sent.
  bool completed() const { return completed_; }

 private:
  bool WriteDelta(const specserve::v1::TokenDelta& delta,
                  grpc::WriteOptions options);
  bool WriteFinal(const specserve::v1::GenerateFinal& final,
                  grpc::WriteOptions options);

  grpc::internal::WriterInterface<::vllm::grpc::engine::GenerateResponse>* const
      out_;
  const bool stream_;
  const uint32_t prompt_tokens_;
  const std::optional<uint32_t> first_prompt_id_;
  // Ids sent (stream) or gathered (not stream).
  uint32_t emitted_ = 0;
  ::vllm::grpc::engine::GenerateComplete complete_;
  bool completed_ = false;
};

// The vLLM finish reason of a specserve one.
const char* FinishReasonName(specserve::v1::FinishReason reason);

}  // namespace specserve::scheduler::vllm_engine

#endif  // SPECSERVE_SCHEDULER_VLLM_ENGINE_RESPONSE_ADAPTER_H_
