#include "scheduler/request_validation.h"

#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specserve::scheduler {
namespace {

namespace v1 = specserve::v1;
using ::testing::AllOf;
using ::testing::HasSubstr;

Limits TestLimits() {
  Limits l;
  l.vocab_size = 1000;
  l.max_context = 4096;
  return l;
}

v1::GenerateRequest TextRequest(const std::string& text = "hello") {
  v1::GenerateRequest r;
  r.set_text(text);
  return r;
}

v1::GenerateRequest IdsRequest(std::initializer_list<uint32_t> ids) {
  v1::GenerateRequest r;
  r.mutable_token_ids();  // set the oneof even when empty
  for (uint32_t id : ids) r.mutable_token_ids()->add_ids(id);
  return r;
}

void ExpectInvalid(const v1::GenerateRequest& r, const std::string& fragment) {
  absl::Status s = ValidateGenerateRequest(r, TestLimits());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(fragment));
}

TEST(RequestValidationTest, PlainRequestsAreValid) {
  EXPECT_TRUE(ValidateGenerateRequest(TextRequest(), TestLimits()).ok());
  EXPECT_TRUE(
      ValidateGenerateRequest(IdsRequest({1, 2, 999}), TestLimits()).ok());
  v1::GenerateRequest r = TextRequest();
  r.mutable_sampling()->set_temperature(0.7f);
  r.mutable_sampling()->set_top_p(1.0f);
  r.mutable_sampling()->set_min_p(0.05f);
  r.mutable_sampling()->set_top_k(1000);
  r.mutable_stopping()->set_max_tokens(4096);
  r.mutable_stopping()->add_stop("\n\n");
  r.mutable_speculation()->set_enable(true);
  r.mutable_speculation()->set_k(8);
  EXPECT_TRUE(ValidateGenerateRequest(r, TestLimits()).ok());
}

// vLLM's logit controls: penalties in their bounds, biases on ids of the
// vocabulary within [-100, 100], min_tokens up to max_tokens.
TEST(RequestValidationTest, LogitControlsInTheirBounds) {
  v1::GenerateRequest r = IdsRequest({1, 2});
  v1::SamplingParams* s = r.mutable_sampling();
  s->set_presence_penalty(-2.0f);
  s->set_frequency_penalty(2.0f);
  s->set_repetition_penalty(1.5f);
  (*s->mutable_logit_bias())[999] = -100.0f;
  (*s->mutable_logit_bias())[0] = 100.0f;
  r.mutable_stopping()->set_max_tokens(8);
  r.mutable_stopping()->set_min_tokens(8);
  EXPECT_TRUE(ValidateGenerateRequest(r, TestLimits()).ok());

  for (float bad : {2.01f, -3.0f, NAN, INFINITY}) {
    v1::GenerateRequest q = r;
    q.mutable_sampling()->set_presence_penalty(bad);
    ExpectInvalid(q, "sampling.presence_penalty");
    q = r;
    q.mutable_sampling()->set_frequency_penalty(bad);
    ExpectInvalid(q, "sampling.frequency_penalty");
  }
  for (float bad : {-0.5f, NAN, INFINITY}) {
    v1::GenerateRequest q = r;
    q.mutable_sampling()->set_repetition_penalty(bad);
    ExpectInvalid(q, "sampling.repetition_penalty");
  }
  v1::GenerateRequest q = r;
  (*q.mutable_sampling()->mutable_logit_bias())[1000] = 1.0f;
  ExpectInvalid(q, "sampling.logit_bias: token id 1000 is outside");
  q = r;
  (*q.mutable_sampling()->mutable_logit_bias())[5] = 100.5f;
  ExpectInvalid(q, "sampling.logit_bias[5] = 100.5");
  q = r;
  for (uint32_t id = 0; id <= TestLimits().max_logit_bias; ++id) {
    (*q.mutable_sampling()->mutable_logit_bias())[id % 1000] = 1.0f;
  }
  Limits small = TestLimits();
  small.max_logit_bias = 3;
  EXPECT_THAT(std::string(ValidateGenerateRequest(q, small).message()),
              HasSubstr("sampling.logit_bias has 1000 entries; at most 3"));
  q = r;
  q.mutable_stopping()->set_min_tokens(9);
  ExpectInvalid(q, "stopping.min_tokens = 9 exceeds stopping.max_tokens (8)");
  q.mutable_stopping()->set_max_tokens(0);  // up to the context
  EXPECT_TRUE(ValidateGenerateRequest(q, TestLimits()).ok());
  q.mutable_stopping()->set_min_tokens(4097);
  ExpectInvalid(q, "stopping.min_tokens = 4097 exceeds the model context");
}

TEST(RequestValidationTest, InputMustBeSetUnlessContinuingASession) {
  v1::GenerateRequest none;
  ExpectInvalid(none, "input is missing");
  ExpectInvalid(TextRequest(""), "input text is empty");
  ExpectInvalid(IdsRequest({}), "input token_ids is empty");

  // A new session (no id) with no input is still an error.
  v1::GenerateRequest new_session = IdsRequest({});
  new_session.mutable_session()->set_capacity(100);
  ExpectInvalid(new_session, "only to continue an existing session");

  for (v1::GenerateRequest r :
       {v1::GenerateRequest(), TextRequest(""), IdsRequest({})}) {
    r.mutable_session()->set_session_id("ses_0123");
    EXPECT_TRUE(ValidateGenerateRequest(r, TestLimits()).ok());
    r.mutable_session()->set_mode(v1::SessionTurn::REWIND);  // regenerate
    EXPECT_TRUE(ValidateGenerateRequest(r, TestLimits()).ok());
  }
}

TEST(RequestValidationTest, OutOfVocabularyIdNamesPositionAndValue) {
  ExpectInvalid(IdsRequest({5, 1000, 2000}),
                "token_ids[1] = 1000 is outside the vocabulary (ids must be "
                "< 1000)");
  ExpectInvalid(IdsRequest({4294967295u}), "token_ids[0] = 4294967295");
}

TEST(RequestValidationTest, Temperature) {
  for (float t : {-0.1f, std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::infinity()}) {
    v1::GenerateRequest r = TextRequest();
    r.mutable_sampling()->set_temperature(t);
    ExpectInvalid(r, "sampling.temperature");
  }
  v1::GenerateRequest greedy = TextRequest();
  greedy.mutable_sampling()->set_temperature(0);
  EXPECT_TRUE(ValidateGenerateRequest(greedy, TestLimits()).ok());
}

TEST(RequestValidationTest, TopPMinPTopK) {
  for (float p : {-0.5f, 1.01f, std::numeric_limits<float>::quiet_NaN()}) {
    v1::GenerateRequest r = TextRequest();
    r.mutable_sampling()->set_top_p(p);
    ExpectInvalid(r, "sampling.top_p");
  }
  for (float p : {0.0f, 0.01f, 1.0f}) {  // 0 = unset
    v1::GenerateRequest r = TextRequest();
    r.mutable_sampling()->set_top_p(p);
    EXPECT_TRUE(ValidateGenerateRequest(r, TestLimits()).ok()) << p;
  }
  for (float p : {-0.1f, 1.0f, std::numeric_limits<float>::infinity()}) {
    v1::GenerateRequest r = TextRequest();
    r.mutable_sampling()->set_min_p(p);
    ExpectInvalid(r, "sampling.min_p");
  }
  v1::GenerateRequest r = TextRequest();
  r.mutable_sampling()->set_top_k(1001);
  ExpectInvalid(r, "sampling.top_k = 1001 exceeds the vocabulary size");
}

TEST(RequestValidationTest, SpeculationKUpToTheDraftDepthLimit) {
  v1::GenerateRequest r = TextRequest();
  r.mutable_speculation()->set_enable(true);
  for (int k = 0; k <= kMaxDraftDepth; ++k) {  // 0: the server's default
    r.mutable_speculation()->set_k(k);
    EXPECT_TRUE(ValidateGenerateRequest(r, TestLimits()).ok()) << k;
  }
  // Over the limit: refused naming the value and the limit, whatever else
  // the request asks (a session turn, speculation off).
  const std::string over = absl::StrCat("speculation.k ", kMaxDraftDepth + 1,
                                        " is over the limit ", kMaxDraftDepth);
  r.mutable_speculation()->set_k(kMaxDraftDepth + 1);
  ExpectInvalid(r, over);
  r.mutable_session()->set_session_id("ses_x");
  ExpectInvalid(r, over);
  r.mutable_speculation()->set_enable(false);
  ExpectInvalid(r, over);
  r.mutable_speculation()->set_k(UINT32_MAX);
  ExpectInvalid(r, absl::StrCat("speculation.k 4294967295 is over the limit ",
                                kMaxDraftDepth));
}

TEST(RequestValidationTest, LogprobsRange) {
  for (uint32_t n : {0u, 1u, 20u}) {
    v1::GenerateRequest r = TextRequest();
    r.mutable_response()->set_logprobs(n);
    r.mutable_response()->set_prompt_logprobs(n);
    EXPECT_TRUE(ValidateGenerateRequest(r, TestLimits()).ok()) << n;
  }
  v1::GenerateRequest r = TextRequest();
  r.mutable_response()->set_logprobs(21);
  ExpectInvalid(r, "response.logprobs = 21; it must be 0..20");
  r = TextRequest();
  r.mutable_response()->set_prompt_logprobs(4000000000u);
  ExpectInvalid(r, "response.prompt_logprobs = 4000000000; it must be 0..20");
}

TEST(RequestValidationTest, MaxTokensAndStops) {
  v1::GenerateRequest huge = TextRequest();
  huge.mutable_stopping()->set_max_tokens(4000000000u);
  ExpectInvalid(huge,
                "stopping.max_tokens = 4000000000 exceeds the model "
                "context (4096 tokens)");

  v1::GenerateRequest many = TextRequest();
  for (int i = 0; i < 17; ++i) many.mutable_stopping()->add_stop("x");
  ExpectInvalid(many, "stopping.stop has 17 strings; at most 16");

  v1::GenerateRequest long_stop = TextRequest();
  long_stop.mutable_stopping()->add_stop(std::string(257, 'a'));
  ExpectInvalid(long_stop, "stopping.stop[0] is 257 bytes");

  v1::GenerateRequest empty_stop = TextRequest();
  empty_stop.mutable_stopping()->add_stop("ok");
  empty_stop.mutable_stopping()->add_stop("");
  ExpectInvalid(empty_stop, "stopping.stop[1] is empty");

  v1::GenerateRequest bad_stop_id = TextRequest();
  bad_stop_id.mutable_stopping()->add_stop_token_ids(3);
  bad_stop_id.mutable_stopping()->add_stop_token_ids(1000);
  ExpectInvalid(bad_stop_id, "stopping.stop_token_ids[1] = 1000");

  v1::GenerateRequest many_ids = TextRequest();
  for (int i = 0; i < 65; ++i)
    many_ids.mutable_stopping()->add_stop_token_ids(1);
  ExpectInvalid(many_ids, "stop_token_ids has 65 ids");
}

TEST(RequestValidationTest, TokenIdPromptIsCheckedAgainstContextEarly) {
  Limits limits = TestLimits();
  limits.max_context = 8;
  v1::GenerateRequest r = IdsRequest({1, 2, 3, 4, 5});
  r.mutable_stopping()->set_max_tokens(4);
  absl::Status s = ValidateGenerateRequest(r, limits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "prompt (5 tokens) + max_tokens (4) exceeds the model context "
            "(8)");
  r.mutable_stopping()->set_max_tokens(3);
  EXPECT_TRUE(ValidateGenerateRequest(r, limits).ok());
}

TEST(RequestValidationTest, TextSizeBound) {
  Limits limits = TestLimits();
  limits.max_text_bytes = 10;
  EXPECT_TRUE(ValidateGenerateRequest(TextRequest("0123456789"), limits).ok());
  absl::Status s = ValidateGenerateRequest(TextRequest("0123456789a"), limits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("11 bytes"));
}

TEST(RequestValidationTest, StructuredOutputNeedsAKindAndABoundedText) {
  const Limits l = TestLimits();
  v1::GenerateRequest r = TextRequest();
  r.mutable_structured_output()->set_regex("[a-z]+");
  EXPECT_TRUE(ValidateGenerateRequest(r, l).ok());
  r.mutable_structured_output()->set_json_object(true);
  EXPECT_TRUE(ValidateGenerateRequest(r, l).ok());
  r.mutable_structured_output()->mutable_choice()->add_values("yes");
  EXPECT_TRUE(ValidateGenerateRequest(r, l).ok());

  r.mutable_structured_output()->Clear();
  absl::Status s = ValidateGenerateRequest(r, l);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("structured_output has no kind"));

  r.mutable_structured_output()->mutable_choice();
  s = ValidateGenerateRequest(r, l);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("structured_output.choice"));

  // At the limit, then one byte over it (choices count together).
  r.mutable_structured_output()->set_ebnf(
      std::string(kMaxGrammarTextBytes, 'x'));
  EXPECT_TRUE(ValidateGenerateRequest(r, l).ok());
  r.mutable_structured_output()->set_json_schema(
      std::string(kMaxGrammarTextBytes + 1, ' '));
  s = ValidateGenerateRequest(r, l);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("over the limit"),
                    HasSubstr(absl::StrCat(kMaxGrammarTextBytes))));
  v1::Choices* c = r.mutable_structured_output()->mutable_choice();
  c->add_values(std::string(kMaxGrammarTextBytes / 2, 'a'));
  c->add_values(std::string(kMaxGrammarTextBytes / 2 + 1, 'b'));
  EXPECT_EQ(ValidateGenerateRequest(r, l).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RequestValidationTest, SessionParams) {
  v1::GenerateRequest big = TextRequest();
  big.mutable_session()->set_capacity(4097);
  ExpectInvalid(big, "session.capacity = 4097 exceeds the model context");

  // Room for one prompt token and one round at the largest k (8): 10 rows.
  EXPECT_EQ(MinSessionCapacity(), 10u);
  v1::GenerateRequest tiny = TextRequest();
  tiny.mutable_session()->set_capacity(9);
  ExpectInvalid(tiny, "session.capacity = 9 is below the minimum of 10");
  tiny.mutable_session()->set_capacity(10);
  EXPECT_TRUE(ValidateGenerateRequest(tiny, TestLimits()).ok());
  tiny.mutable_session()->set_capacity(0);  // the server's default
  EXPECT_TRUE(ValidateGenerateRequest(tiny, TestLimits()).ok());
  EXPECT_EQ(ValidateSessionCapacity(1, TestLimits(), "capacity").code(),
            absl::StatusCode::kInvalidArgument);

  v1::GenerateRequest rewind_new = TextRequest();
  rewind_new.mutable_session()->set_mode(v1::SessionTurn::REWIND);
  ExpectInvalid(rewind_new, "REWIND needs session.session_id");

  v1::GenerateRequest long_id = TextRequest();
  long_id.mutable_session()->set_session_id(std::string(129, 'a'));
  ExpectInvalid(long_id, "session.session_id is 129 bytes");

  v1::GenerateRequest bad_mode = TextRequest();
  bad_mode.mutable_session()->set_session_id("ses_1");
  bad_mode.mutable_session()->set_mode(static_cast<v1::SessionTurn::Mode>(7));
  ExpectInvalid(bad_mode, "session.mode = 7");

  v1::GenerateRequest long_request_id = TextRequest();
  long_request_id.set_request_id(std::string(200, 'r'));
  ExpectInvalid(long_request_id, "request_id is 200 bytes");
}

TEST(RequestValidationTest, PromptLength) {
  Limits limits = TestLimits();
  EXPECT_TRUE(ValidatePromptLength(4000, 96, limits).ok());
  EXPECT_TRUE(ValidatePromptLength(4096, 0, limits).ok());
  absl::Status s = ValidatePromptLength(4000, 97, limits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "prompt (4000 tokens) + max_tokens (97) exceeds the model "
            "context (4096)");
  s = ValidatePromptLength(5000, 0, limits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "prompt (5000 tokens) exceeds the model context (4096)");
}

TEST(RequestValidationTest, SessionTurnOverflowIsOutOfRange) {
  EXPECT_TRUE(ValidateSessionTurn(900, 24, 100, 1024).ok());
  EXPECT_TRUE(ValidateSessionTurn(1000, 24, 0, 1024).ok());
  absl::Status s = ValidateSessionTurn(900, 24, 101, 1024);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("committed 900"), HasSubstr("capacity 1024"),
                    HasSubstr("lower max_tokens to at most 100")));
  s = ValidateSessionTurn(1000, 100, 0, 1024);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("committed 1000"), HasSubstr("capacity 1024"),
                    HasSubstr("open a new session")));
}

}  // namespace
}  // namespace specserve::scheduler
