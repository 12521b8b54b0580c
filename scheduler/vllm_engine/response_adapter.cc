#include "scheduler/vllm_engine/response_adapter.h"

namespace specserve::scheduler::vllm_engine {

namespace vproto = ::vllm::grpc::engine;

namespace {

void AddTop(const specserve::v1::TokenLogprobs& lp, vproto::TopLogProbs* top) {
  for (int i = 0; i < lp.top_ids_size() && i < lp.top_logprobs_size(); ++i) {
    top->add_token_ids(lp.top_ids(i));
    top->add_values(lp.top_logprobs(i));
  }
}

void AddOutput(const specserve::v1::TokenLogprobs& lp,
               vproto::OutputLogProbs* out) {
  out->add_token_ids(lp.id());
  out->add_token_logprobs(lp.logprob());
  AddTop(lp, out->add_top_logprobs());
}

}  // namespace

const char* FinishReasonName(specserve::v1::FinishReason reason) {
  switch (reason) {
    case specserve::v1::STOP:
      return "stop";
    case specserve::v1::LENGTH:
    case specserve::v1::CONTEXT_FULL:
      return "length";
    case specserve::v1::CANCELLED:
      return "abort";
    default:
      return "error";
  }
}

ResponseAdapter::ResponseAdapter(
    grpc::internal::WriterInterface<vproto::GenerateResponse>* out, bool stream,
    uint32_t prompt_tokens, std::optional<uint32_t> first_prompt_id)
    : out_(out),
      stream_(stream),
      prompt_tokens_(prompt_tokens),
      first_prompt_id_(first_prompt_id) {}

bool ResponseAdapter::Write(const specserve::v1::GenerateEvent& event,
                            grpc::WriteOptions options) {
  if (event.has_delta()) return WriteDelta(event.delta(), options);
  if (event.has_final()) return WriteFinal(event.final(), options);
  return true;
}

bool ResponseAdapter::WriteDelta(const specserve::v1::TokenDelta& delta,
                                 grpc::WriteOptions options) {
  vproto::GenerateResponse chunk_response;
  vproto::GenerateStreamChunk* chunk = chunk_response.mutable_chunk();
  for (int i = 0; i < delta.ids_size(); ++i) {
    ++emitted_;
    if (stream_) {
      chunk->add_token_ids(delta.ids(i));
    } else {
      complete_.add_output_ids(delta.ids(i));
    }
    if (i < delta.logprobs_size()) {
      AddOutput(delta.logprobs(i), stream_
                                       ? chunk->mutable_output_logprobs()
                                       : complete_.mutable_output_logprobs());
    }
  }
  if (!stream_ || chunk->token_ids_size() == 0) return true;
  chunk->set_prompt_tokens(prompt_tokens_);
  chunk->set_completion_tokens(chunk->token_ids_size());
  return out_->Write(chunk_response, options);
}

bool ResponseAdapter::WriteFinal(const specserve::v1::GenerateFinal& final,
                                 grpc::WriteOptions options) {
  vproto::GenerateResponse response;
  vproto::GenerateComplete* complete = response.mutable_complete();
  *complete = std::move(complete_);
  if (final.prompt_logprobs_size() > 0) {
    vproto::InputLogProbs* in = complete->mutable_input_logprobs();
    if (first_prompt_id_.has_value()) {
      in->add_token_logprobs();  // no value: nothing precedes it
      in->add_token_ids(*first_prompt_id_);
      in->add_top_logprobs();
    }
    for (const specserve::v1::TokenLogprobs& lp : final.prompt_logprobs()) {
      in->add_token_logprobs()->set_value(lp.logprob());
      in->add_token_ids(lp.id());
      AddTop(lp, in->add_top_logprobs());
    }
  }
  complete->set_finish_reason(FinishReasonName(final.finish_reason()));
  switch (final.matched_stop_case()) {
    case specserve::v1::GenerateFinal::kMatchedTokenId:
      complete->set_matched_token_id(final.matched_token_id());
      break;
    case specserve::v1::GenerateFinal::kMatchedStopStr:
      complete->set_matched_stop_str(final.matched_stop_str());
      break;
    case specserve::v1::GenerateFinal::MATCHED_STOP_NOT_SET:
      break;
  }
  complete->set_prompt_tokens(final.usage().prompt_tokens());
  complete->set_completion_tokens(emitted_);
  complete->set_cached_tokens(final.usage().cached_prompt_tokens());
  complete->set_spec_draft_tokens(
      static_cast<uint32_t>(final.spec_stats().drafted()));
  complete->set_spec_accepted_tokens(
      static_cast<uint32_t>(final.spec_stats().accepted()));
  completed_ = true;
  return out_->Write(response, options);
}

}  // namespace specserve::scheduler::vllm_engine
