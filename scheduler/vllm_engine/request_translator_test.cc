#include "scheduler/vllm_engine/request_translator.h"

#include "gtest/gtest.h"

namespace specserve::scheduler::vllm_engine {
namespace {

namespace vproto = ::vllm::grpc::engine;

vproto::GenerateRequest Tokenized(std::initializer_list<uint32_t> ids) {
  vproto::GenerateRequest r;
  r.set_request_id("req-1");
  for (uint32_t id : ids) r.mutable_tokenized()->add_input_ids(id);
  return r;
}

Limits TestLimits() {
  Limits l;
  l.vocab_size = 1000;
  l.max_context = 4;
  return l;
}

TEST(RequestTranslator, MapsSamplingStoppingAndSpeculation) {
  vproto::GenerateRequest in = Tokenized({5, 6, 7});
  vproto::SamplingParams* p = in.mutable_sampling_params();
  p->set_temperature(0.5f);
  p->set_top_p(0.9f);
  p->set_top_k(40);
  p->set_min_p(0.05f);
  p->set_seed(0);
  p->set_max_tokens(16);
  p->add_stop("\n\n");
  p->add_stop_token_ids(9);
  p->set_ignore_eos(true);
  p->set_include_stop_str_in_output(true);
  in.set_stream(true);
  GatewayOptions options;
  options.speculation = true;
  options.k = 4;
  auto out = TranslateGenerateRequest(in, options, TestLimits());
  ASSERT_TRUE(out.ok()) << out.status();
  const specserve::v1::GenerateRequest& r = out->request;
  EXPECT_EQ(r.request_id(), "req-1");
  EXPECT_EQ(r.token_ids().ids_size(), 3);
  EXPECT_FLOAT_EQ(r.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(r.sampling().top_p(), 0.9f);
  EXPECT_EQ(r.sampling().top_k(), 40u);
  EXPECT_FLOAT_EQ(r.sampling().min_p(), 0.05f);
  EXPECT_EQ(r.sampling().seed(), SpecserveSeed(0));
  EXPECT_NE(r.sampling().seed(), 0u);
  EXPECT_EQ(r.stopping().max_tokens(), 16u);
  EXPECT_EQ(r.stopping().stop(0), "\n\n");
  EXPECT_EQ(r.stopping().stop_token_ids(0), 9u);
  EXPECT_TRUE(r.stopping().ignore_eos());
  EXPECT_TRUE(r.speculation().enable());
  EXPECT_EQ(r.speculation().k(), 4u);
  EXPECT_TRUE(r.response().ids());
  EXPECT_FALSE(r.response().text());
  EXPECT_FALSE(r.has_session());
  EXPECT_TRUE(out->stream);
  EXPECT_EQ(out->prompt_tokens, 3u);
}

TEST(RequestTranslator, UnsetTemperatureIsOneAndUnsetMaxTokensIsOpen) {
  auto out =
      TranslateGenerateRequest(Tokenized({1}), GatewayOptions{}, TestLimits());
  ASSERT_TRUE(out.ok());
  EXPECT_FLOAT_EQ(out->request.sampling().temperature(), 1.0f);
  EXPECT_EQ(out->request.stopping().max_tokens(), 0u);
  EXPECT_EQ(out->request.sampling().seed(), 0u);
}

TEST(RequestTranslator, SeedsAreDistinctAndNonzero) {
  EXPECT_NE(SpecserveSeed(0), SpecserveSeed(1));
  EXPECT_NE(SpecserveSeed(-1), SpecserveSeed(1));
  EXPECT_NE(SpecserveSeed(-1), 0u);
}

TEST(RequestTranslator, TruncatesPromptToItsLastTokens) {
  vproto::GenerateRequest in = Tokenized({1, 2, 3, 4, 5, 6});
  in.mutable_sampling_params()->set_truncate_prompt_tokens(2);
  auto out = TranslateGenerateRequest(in, GatewayOptions{}, TestLimits());
  ASSERT_TRUE(out.ok());
  ASSERT_EQ(out->request.token_ids().ids_size(), 2);
  EXPECT_EQ(out->request.token_ids().ids(0), 5u);
  in.mutable_sampling_params()->set_truncate_prompt_tokens(-1);
  out = TranslateGenerateRequest(in, GatewayOptions{}, TestLimits());
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->request.token_ids().ids_size(), 4);  // max_context
  EXPECT_EQ(out->prompt_tokens, 4u);
}

struct Case {
  const char* name;
  void (*build)(vproto::GenerateRequest*);
  absl::StatusCode code;
  const char* field;
};

TEST(RequestTranslator, RefusesWhatItCannotHonourNamingTheField) {
  const Case cases[] = {
      {"n", [](auto* r) { r->mutable_sampling_params()->set_n(17); },
       absl::StatusCode::kInvalidArgument, "sampling_params.n"},
      {"min_tokens over max_tokens",
       [](auto* r) {
         r->mutable_sampling_params()->set_max_tokens(3);
         r->mutable_sampling_params()->set_min_tokens(4);
       },
       absl::StatusCode::kInvalidArgument, "sampling_params.min_tokens"},
      {"logit_bias id outside the vocabulary",
       [](auto* r) {
         (*r->mutable_sampling_params()->mutable_logit_bias())[1000] = 1.0f;
       },
       absl::StatusCode::kInvalidArgument, "sampling_params.logit_bias"},
      {"logit_bias negative id",
       [](auto* r) {
         (*r->mutable_sampling_params()->mutable_logit_bias())[-1] = 1.0f;
       },
       absl::StatusCode::kInvalidArgument, "sampling_params.logit_bias"},
      {"logit_bias over 100",
       [](auto* r) {
         (*r->mutable_sampling_params()->mutable_logit_bias())[3] = 101.0f;
       },
       absl::StatusCode::kInvalidArgument, "sampling_params.logit_bias"},
      {"frequency over 2",
       [](auto* r) {
         r->mutable_sampling_params()->set_frequency_penalty(2.5f);
       },
       absl::StatusCode::kInvalidArgument, "sampling_params.frequency_penalty"},
      {"presence under -2",
       [](auto* r) { r->mutable_sampling_params()->set_presence_penalty(-3); },
       absl::StatusCode::kInvalidArgument, "sampling_params.presence_penalty"},
      {"repetition negative",
       [](auto* r) {
         r->mutable_sampling_params()->set_repetition_penalty(-1.0f);
       },
       absl::StatusCode::kInvalidArgument,
       "sampling_params.repetition_penalty"},
      {"logprobs all",
       [](auto* r) { r->mutable_sampling_params()->set_logprobs(-1); },
       absl::StatusCode::kInvalidArgument, "sampling_params.logprobs"},
      {"prompt logprobs 21",
       [](auto* r) { r->mutable_sampling_params()->set_prompt_logprobs(21); },
       absl::StatusCode::kInvalidArgument, "sampling_params.prompt_logprobs"},
      {"max_tokens 0",
       [](auto* r) { r->mutable_sampling_params()->set_max_tokens(0); },
       absl::StatusCode::kInvalidArgument, "sampling_params.max_tokens"},
      {"structural_tag",
       [](auto* r) { r->mutable_sampling_params()->set_structural_tag("{}"); },
       absl::StatusCode::kUnimplemented, "sampling_params.structural_tag"},
      {"mm", [](auto* r) { r->mutable_mm_inputs(); },
       absl::StatusCode::kUnimplemented, "mm_inputs"},
      {"media", [](auto* r) { r->mutable_media_refs(); },
       absl::StatusCode::kUnimplemented, "media_refs"},
      {"kv", [](auto* r) { r->mutable_kv_transfer_params(); },
       absl::StatusCode::kUnimplemented, "kv_transfer_params"},
      {"dp rank", [](auto* r) { r->set_data_parallel_rank(2); },
       absl::StatusCode::kInvalidArgument, "data_parallel_rank"},
      {"no input", [](auto* r) { r->clear_tokenized(); },
       absl::StatusCode::kInvalidArgument, "input"},
  };
  for (const Case& c : cases) {
    vproto::GenerateRequest in = Tokenized({1, 2});
    c.build(&in);
    auto out = TranslateGenerateRequest(in, GatewayOptions{}, TestLimits());
    ASSERT_FALSE(out.ok()) << c.name;
    EXPECT_EQ(out.status().code(), c.code) << c.name;
    EXPECT_EQ(out.status().message().substr(0, strlen(c.field) + 1),
              std::string(c.field) + ":")
        << c.name << ": " << out.status().message();
  }
}

TEST(RequestTranslator, MapsEveryConstraintToStructuredOutput) {
  auto translate = [](auto set) {
    vproto::GenerateRequest in = Tokenized({5});
    set(in.mutable_sampling_params());
    auto out = TranslateGenerateRequest(in, GatewayOptions(), TestLimits());
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? out->request : specserve::v1::GenerateRequest();
  };
  EXPECT_FALSE(translate([](auto*) {}).has_structured_output());
  EXPECT_EQ(
      translate([](auto* p) { p->set_json_schema("{\"type\": \"integer\"}"); })
          .structured_output()
          .json_schema(),
      "{\"type\": \"integer\"}");
  EXPECT_EQ(translate([](auto* p) { p->set_regex("[ab]+"); })
                .structured_output()
                .regex(),
            "[ab]+");
  EXPECT_EQ(translate([](auto* p) { p->set_grammar("root ::= \"x\""); })
                .structured_output()
                .ebnf(),
            "root ::= \"x\"");
  EXPECT_TRUE(translate([](auto* p) { p->set_json_object(true); })
                  .structured_output()
                  .json_object());
  const specserve::v1::GenerateRequest choice = translate([](auto* p) {
    p->mutable_choice()->add_choices("yes");
    p->mutable_choice()->add_choices("no");
  });
  ASSERT_EQ(choice.structured_output().choice().values_size(), 2);
  EXPECT_EQ(choice.structured_output().choice().values(1), "no");
}

TEST(RequestTranslator, MapsLogprobs) {
  vproto::GenerateRequest in = Tokenized({8, 9});
  in.mutable_sampling_params()->set_logprobs(0);
  in.mutable_sampling_params()->set_prompt_logprobs(20);
  auto out = TranslateGenerateRequest(in, GatewayOptions{}, TestLimits());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->request.response().has_logprobs());
  EXPECT_EQ(out->request.response().logprobs(), 0u);
  EXPECT_EQ(out->request.response().prompt_logprobs(), 20u);
  EXPECT_EQ(out->first_prompt_id, 8u);
  out =
      TranslateGenerateRequest(Tokenized({1}), GatewayOptions{}, TestLimits());
  ASSERT_TRUE(out.ok());
  EXPECT_FALSE(out->request.response().has_logprobs());
  EXPECT_FALSE(out->request.response().has_prompt_logprobs());
}

// vLLM's logit controls map to specserve.v1's; the stop token that ends
// the output is shown, as vLLM's output ids hold it.
TEST(RequestTranslator, MapsLogitControls) {
  vproto::GenerateRequest in = Tokenized({1, 2});
  vproto::SamplingParams* p = in.mutable_sampling_params();
  p->set_frequency_penalty(0.5f);
  p->set_presence_penalty(-2.0f);
  p->set_repetition_penalty(1.2f);
  (*p->mutable_logit_bias())[7] = -100.0f;
  (*p->mutable_logit_bias())[999] = 3.5f;
  p->set_max_tokens(10);
  p->set_min_tokens(10);
  auto out = TranslateGenerateRequest(in, GatewayOptions{}, TestLimits());
  ASSERT_TRUE(out.ok()) << out.status();
  const specserve::v1::GenerateRequest& r = out->request;
  EXPECT_FLOAT_EQ(r.sampling().frequency_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(r.sampling().presence_penalty(), -2.0f);
  EXPECT_FLOAT_EQ(r.sampling().repetition_penalty(), 1.2f);
  ASSERT_EQ(r.sampling().logit_bias_size(), 2);
  EXPECT_FLOAT_EQ(r.sampling().logit_bias().at(7), -100.0f);
  EXPECT_FLOAT_EQ(r.sampling().logit_bias().at(999), 3.5f);
  EXPECT_EQ(r.stopping().min_tokens(), 10u);
  EXPECT_TRUE(r.response().include_stop_token());
}

TEST(RequestTranslator, NeutralPenaltiesAreAccepted) {
  vproto::GenerateRequest in = Tokenized({1});
  in.mutable_sampling_params()->set_repetition_penalty(1.0f);
  in.mutable_sampling_params()->set_n(1);
  in.set_data_parallel_rank(0);
  EXPECT_TRUE(
      TranslateGenerateRequest(in, GatewayOptions{}, TestLimits()).ok());
}

}  // namespace
}  // namespace specserve::scheduler::vllm_engine
