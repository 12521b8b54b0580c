#include "worker/burst_request.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/api_limits.h"

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
    absl::StatusOr<spec::BurstParams> p = BurstParamsOf(Burst(k), false);
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
  absl::StatusOr<spec::BurstParams> p = BurstParamsOf(r, false);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->max_emit.has_value());  // unset: rounds may overshoot
  for (uint32_t emit : {16u, 17u, static_cast<uint32_t>(INT32_MAX)}) {
    r.set_max_emit(emit);
    EXPECT_TRUE(CheckBurstLimits(r).ok()) << emit;
    p = BurstParamsOf(r, false);
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
  absl::StatusOr<spec::BurstParams> p = BurstParamsOf(r, false);
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
  p = BurstParamsOf(r, false);
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

}  // namespace
}  // namespace specserve::worker
