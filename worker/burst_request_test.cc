#include "worker/burst_request.h"

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/api_limits.h"
#include "worker/model/test_data.h"

namespace specserve::worker {
namespace {

using ::testing::HasSubstr;
using v1::AdmitRequest;
using v1::BurstRequest;

BurstRequest Burst(uint32_t k) {
  BurstRequest r;
  r.set_session_id("s");
  r.set_max_new(16);
  r.set_k(k);
  return r;
}

TEST(BurstRequestTest, KUpToTheDraftDepthLimitRuns) {
  for (int k = 0; k <= kMaxDraftDepth; ++k) {  // 0: plain decode
    EXPECT_TRUE(CheckBurstLimits(Burst(k)).ok()) << k;
    absl::StatusOr<spec::BurstParams> p =
        BurstParamsOf(Burst(k), false, nullptr);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->k, k);
  }
}

// Every session is sized for at most kMaxDraftDepth drafts: a deeper burst
// is refused naming the limit, not run at a shallower depth.
TEST(BurstRequestTest, KOverTheDraftDepthLimitIsInvalid) {
  for (uint32_t k : {static_cast<uint32_t>(kMaxDraftDepth) + 1, 15u, 16u,
                     uint32_t{1} << 31, UINT32_MAX}) {
    const absl::Status s = CheckBurstLimits(Burst(k));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << k;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("k ", k, " is over the limit ",
                                       kMaxDraftDepth)));
  }
}

TEST(BurstRequestTest, MaxEmitAtLeastMaxNew) {
  BurstRequest r = Burst(4);
  absl::StatusOr<spec::BurstParams> p = BurstParamsOf(r, false, nullptr);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->max_emit.has_value());  // unset: rounds may overshoot
  for (uint32_t emit : {16u, 17u, static_cast<uint32_t>(INT32_MAX)}) {
    r.set_max_emit(emit);
    EXPECT_TRUE(CheckBurstLimits(r).ok()) << emit;
    p = BurstParamsOf(r, false, nullptr);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->max_emit, static_cast<int>(emit));
  }
  for (uint32_t emit : {0u, 15u, static_cast<uint32_t>(INT32_MAX) + 1}) {
    r.set_max_emit(emit);
    const absl::Status s = CheckBurstLimits(r);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << emit;
    EXPECT_THAT(std::string(s.message()), HasSubstr("max_emit"));
  }
}

TEST(BurstRequestTest, AdmitDraftDepthUpToTheLimit) {
  AdmitRequest r;
  r.set_speculative(true);
  EXPECT_TRUE(CheckAdmitLimits(r).ok());
  EXPECT_EQ(DraftDepthOf(r), kMaxDraftDepth);  // 0 = the limit
  for (int d = 1; d <= kMaxDraftDepth; ++d) {
    r.set_draft_depth(d);
    EXPECT_TRUE(CheckAdmitLimits(r).ok()) << d;
    EXPECT_EQ(DraftDepthOf(r), d);
  }
  for (uint32_t d : {static_cast<uint32_t>(kMaxDraftDepth) + 1, UINT32_MAX}) {
    r.set_draft_depth(d);
    const absl::Status s = CheckAdmitLimits(r);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << d;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("draft_depth ", d, " is over the limit ",
                                       kMaxDraftDepth)));
  }
}

// The logit controls travel in the burst's sampling params and its
// min_tokens / prior_output_tokens; unset ones are neutral.
TEST(BurstRequestTest, LogitControlsMapToTheEngine) {
  BurstRequest r = Burst(2);
  r.add_stop_token_ids(7);
  absl::StatusOr<spec::BurstParams> p = BurstParamsOf(r, false, nullptr);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->adjust.active());
  EXPECT_EQ(p->adjust.repetition_penalty, 1.0f);  // 0 = unset = 1

  r.mutable_sampling()->set_presence_penalty(0.5f);
  r.mutable_sampling()->set_frequency_penalty(-1.0f);
  r.mutable_sampling()->set_repetition_penalty(1.3f);
  (*r.mutable_sampling()->mutable_logit_bias())[9] = -100.0f;
  (*r.mutable_sampling()->mutable_logit_bias())[3] = 2.0f;
  r.set_min_tokens(4);
  r.set_prior_output_tokens(6);
  p = BurstParamsOf(r, false, nullptr);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->adjust.presence_penalty, 0.5f);
  EXPECT_EQ(p->adjust.frequency_penalty, -1.0f);
  EXPECT_EQ(p->adjust.repetition_penalty, 1.3f);
  EXPECT_EQ(p->adjust.logit_bias,
            (std::vector<std::pair<int32_t, float>>{{3, 2.0f}, {9, -100.0f}}));
  EXPECT_EQ(p->adjust.min_tokens, 4);
  EXPECT_EQ(p->adjust.stop_ids, std::vector<int32_t>{7});  // what it masks
  EXPECT_EQ(p->prior_output, 6);
}

// A structured_output is compiled before the session is touched: a grammar
// that does not parse is INVALID_ARGUMENT naming the field with the
// parser's message, one without a compiler (no tokenizer.json)
// UNIMPLEMENTED; one that parses becomes the burst's grammar.
TEST(BurstRequestTest, StructuredOutputIsCompiledOrRefused) {
  auto compiler =
      grammar::GrammarCompiler::FromModelDir(model::testing::DefaultModelDir());
  ASSERT_TRUE(compiler.ok()) << compiler.status();
  BurstRequest r = Burst(2);
  r.mutable_structured_output()->set_regex("[0-9]+");
  absl::StatusOr<spec::BurstParams> p =
      BurstParamsOf(r, false, compiler->get());
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->grammar.has_value());
  EXPECT_EQ(BurstParamsOf(r, false, nullptr).status().code(),
            absl::StatusCode::kUnimplemented);
  for (const auto& [set, field] : std::vector<std::pair<
           std::function<void(specserve::v1::StructuredOutput*)>, std::string>>{
           {[](auto* s) { s->set_regex("(open"); }, "structured_output.regex"},
           {[](auto* s) { s->set_json_schema("{\"type\": 7}"); },
            "structured_output.json_schema"},
           {[](auto* s) { s->set_ebnf("root ::= nowhere"); },
            "structured_output.ebnf"},
           {[](auto* s) { s->mutable_choice(); }, "structured_output.choice"},
           {[](auto* s) { s->Clear(); }, "structured_output has no kind"},
       }) {
    set(r.mutable_structured_output());
    p = BurstParamsOf(r, false, compiler->get());
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(std::string(p.status().message()), HasSubstr(field));
  }
}

}  // namespace
}  // namespace specserve::worker
