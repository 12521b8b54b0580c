#include "scheduler/vllm_engine/response_adapter.h"

#include <vector>

#include "gtest/gtest.h"

namespace specserve::scheduler::vllm_engine {
namespace {

namespace vproto = ::vllm::grpc::engine;

class Recorder final
    : public grpc::internal::WriterInterface<vproto::GenerateResponse> {
 public:
  bool Write(const vproto::GenerateResponse& r, grpc::WriteOptions) override {
    sent.push_back(r);
    return true;
  }
  std::vector<vproto::GenerateResponse> sent;
};

specserve::v1::GenerateEvent Delta(std::vector<uint32_t> ids) {
  specserve::v1::GenerateEvent e;
  for (uint32_t id : ids) e.mutable_delta()->add_ids(id);
  return e;
}

specserve::v1::GenerateEvent Final(specserve::v1::FinishReason reason,
                                   uint32_t shown) {
  specserve::v1::GenerateEvent e;
  e.mutable_final()->set_finish_reason(reason);
  e.mutable_final()->mutable_usage()->set_prompt_tokens(7);
  e.mutable_final()->mutable_usage()->set_completion_tokens(shown);
  e.mutable_final()->mutable_usage()->set_cached_prompt_tokens(2);
  e.mutable_final()->mutable_spec_stats()->set_drafted(6);
  e.mutable_final()->mutable_spec_stats()->set_accepted(4);
  return e;
}

TEST(ResponseAdapter, StreamsChunksThenACompleteWithoutIds) {
  Recorder out;
  ResponseAdapter a(&out, /*stream=*/true, 7);
  ASSERT_TRUE(a.Write(Delta({1, 2}), {}));
  ASSERT_TRUE(a.Write(Delta({}), {}));
  ASSERT_TRUE(a.Write(Delta({3}), {}));
  ASSERT_TRUE(a.Write(Final(specserve::v1::STOP, 3), {}));
  ASSERT_EQ(out.sent.size(), 3u);
  EXPECT_EQ(out.sent[0].chunk().token_ids_size(), 2);
  EXPECT_EQ(out.sent[0].chunk().completion_tokens(), 2u);
  EXPECT_EQ(out.sent[0].chunk().prompt_tokens(), 7u);
  EXPECT_EQ(out.sent[1].chunk().token_ids(0), 3u);
  const vproto::GenerateComplete& c = out.sent[2].complete();
  EXPECT_EQ(c.output_ids_size(), 0);
  EXPECT_EQ(c.finish_reason(), "stop");
  EXPECT_EQ(c.completion_tokens(), 3u);
  EXPECT_EQ(c.prompt_tokens(), 7u);
  EXPECT_EQ(c.cached_tokens(), 2u);
  EXPECT_EQ(c.spec_draft_tokens(), 6u);
  EXPECT_EQ(c.spec_accepted_tokens(), 4u);
  EXPECT_TRUE(a.completed());
}

// Every id specserve showed, and its finish reason: a one-shot request's
// output already ends at max_tokens (BurstRequest.max_emit).
TEST(ResponseAdapter, NonStreamingSendsOneCompleteWithEveryId) {
  Recorder out;
  ResponseAdapter a(&out, /*stream=*/false, 0);
  ASSERT_TRUE(a.Write(Delta({1, 2, 3}), {}));
  ASSERT_TRUE(a.Write(Delta({4}), {}));
  EXPECT_TRUE(out.sent.empty());
  ASSERT_TRUE(a.Write(Final(specserve::v1::LENGTH, 4), {}));
  ASSERT_EQ(out.sent.size(), 1u);
  const vproto::GenerateComplete& c = out.sent[0].complete();
  EXPECT_EQ(std::vector<uint32_t>(c.output_ids().begin(), c.output_ids().end()),
            (std::vector<uint32_t>{1, 2, 3, 4}));
  EXPECT_EQ(c.completion_tokens(), 4u);
  EXPECT_EQ(c.finish_reason(), "length");
}

specserve::v1::TokenLogprobs Lp(uint32_t id, float lp, uint32_t top_id,
                                float top_lp) {
  specserve::v1::TokenLogprobs t;
  t.set_id(id);
  t.set_logprob(lp);
  t.add_top_ids(top_id);
  t.add_top_logprobs(top_lp);
  return t;
}

TEST(ResponseAdapter, CarriesLogprobsOfTheIdsSent) {
  Recorder out;
  ResponseAdapter a(&out, /*stream=*/true, 3, /*first_prompt_id=*/40u);
  specserve::v1::GenerateEvent d = Delta({1, 2});
  *d.mutable_delta()->add_logprobs() = Lp(1, -0.5f, 1, -0.5f);
  *d.mutable_delta()->add_logprobs() = Lp(2, -1.5f, 7, -0.1f);
  ASSERT_TRUE(a.Write(d, {}));
  specserve::v1::GenerateEvent f = Final(specserve::v1::LENGTH, 2);
  *f.mutable_final()->add_prompt_logprobs() = Lp(41, -2.0f, 3, -0.2f);
  *f.mutable_final()->add_prompt_logprobs() = Lp(42, -3.0f, 4, -0.3f);
  ASSERT_TRUE(a.Write(f, {}));
  ASSERT_EQ(out.sent.size(), 2u);
  const vproto::OutputLogProbs& o = out.sent[0].chunk().output_logprobs();
  ASSERT_EQ(o.token_ids_size(), 2);
  EXPECT_EQ(o.token_ids(0), 1u);
  EXPECT_FLOAT_EQ(o.token_logprobs(0), -0.5f);
  EXPECT_EQ(o.top_logprobs(0).token_ids(0), 1u);
  EXPECT_EQ(o.token_ids(1), 2u);
  EXPECT_FLOAT_EQ(o.token_logprobs(1), -1.5f);
  EXPECT_EQ(o.top_logprobs(1).token_ids(0), 7u);
  const vproto::InputLogProbs& in = out.sent[1].complete().input_logprobs();
  ASSERT_EQ(in.token_ids_size(), 3);
  EXPECT_EQ(in.token_ids(0), 40u);
  EXPECT_FALSE(in.token_logprobs(0).has_value());
  EXPECT_FLOAT_EQ(in.token_logprobs(2).value(), -3.0f);
  EXPECT_EQ(in.top_logprobs(1).token_ids(0), 3u);
  EXPECT_FLOAT_EQ(in.top_logprobs(1).values(0), -0.2f);
}

// What stopped the output reaches the complete's matched_stop, which the
// gateway shows as matched_stop.
TEST(ResponseAdapter, CarriesTheMatchedStop) {
  for (bool by_token : {true, false}) {
    Recorder out;
    ResponseAdapter a(&out, /*stream=*/false, 7);
    ASSERT_TRUE(a.Write(Delta({4, 5}), {}));
    specserve::v1::GenerateEvent f = Final(specserve::v1::STOP, 2);
    if (by_token) {
      f.mutable_final()->set_matched_token_id(5);
    } else {
      f.mutable_final()->set_matched_stop_str("\n\n");
    }
    ASSERT_TRUE(a.Write(f, {}));
    const vproto::GenerateComplete& c = out.sent.back().complete();
    if (by_token) {
      EXPECT_EQ(c.matched_stop_case(),
                vproto::GenerateComplete::kMatchedTokenId);
      EXPECT_EQ(c.matched_token_id(), 5u);
    } else {
      EXPECT_EQ(c.matched_stop_case(),
                vproto::GenerateComplete::kMatchedStopStr);
      EXPECT_EQ(c.matched_stop_str(), "\n\n");
    }
  }
  Recorder out;
  ResponseAdapter a(&out, /*stream=*/false, 7);
  ASSERT_TRUE(a.Write(Final(specserve::v1::LENGTH, 0), {}));
  EXPECT_EQ(out.sent.back().complete().matched_stop_case(),
            vproto::GenerateComplete::MATCHED_STOP_NOT_SET);
}

TEST(ResponseAdapter, FinishReasons) {
  EXPECT_STREQ(FinishReasonName(specserve::v1::STOP), "stop");
  EXPECT_STREQ(FinishReasonName(specserve::v1::LENGTH), "length");
  EXPECT_STREQ(FinishReasonName(specserve::v1::CONTEXT_FULL), "length");
  EXPECT_STREQ(FinishReasonName(specserve::v1::CANCELLED), "abort");
}

}  // namespace
}  // namespace specserve::scheduler::vllm_engine
