#include "scheduler/spec_gate.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specserve::scheduler {
namespace {

namespace v1 = specserve::v1;
using ::testing::DoubleNear;
using ::testing::HasSubstr;

// Made-up costs shaped like a GPU: a decode pass costs the same up to 4 rows
// (memory-bound), then grows with its rows (compute-bound); a verify of c
// columns costs a little more than one step.
std::vector<double> DecodeTable() {
  std::vector<double> t;
  for (int n = 1; n <= 64; ++n) t.push_back(n <= 4 ? 0.010 : 0.0025 * n);
  return t;
}
const std::vector<double> kDecode = DecodeTable();
const std::vector<double> kVerify = {0.010, 0.011, 0.012, 0.013, 0.014,
                                     0.015, 0.016, 0.017, 0.018};

SpecGateInputs Inputs(uint32_t batch, uint64_t drafted, uint64_t accepted,
                      v1::DecodeMode mode = v1::SPECULATIVE) {
  SpecGateInputs in;
  in.k = 3;
  in.drafted = drafted;
  in.accepted = accepted;
  in.decode_seconds_by_batch = kDecode;
  in.verify_seconds_by_columns = kVerify;
  in.batch_size = batch;
  in.current_mode = mode;
  return in;
}

TEST(SpecGateTest, OneClientSpeculates) {
  // r = 0.7, E = 1 + 0.7*3 = 3.1 (with a small prior pull), V(4)/D(1) = 1.3.
  SpecGateDecision d = DecideSpec(Inputs(1, 3000, 2100));
  EXPECT_EQ(d.mode, v1::SPECULATIVE);
  EXPECT_THAT(d.measured_acceptance, DoubleNear(0.7, 0.01));
  EXPECT_THAT(d.expected_tokens_per_round, DoubleNear(3.1, 0.03));
  EXPECT_THAT(d.verify_cost_ratio, DoubleNear(1.3, 1e-9));
  EXPECT_EQ(d.batch_size, 1u);
  EXPECT_THAT(d.reason, HasSubstr("speculation pays"));
  EXPECT_EQ(d.next_state.below_count, 0u);
}

TEST(SpecGateTest, ManyConcurrentSessionsDemote) {
  // Batch 8: a group verifies 32 rows: ratio = 0.013 * D(32) / (D(4) * D(8))
  // = 0.013 * 0.08 / (0.01 * 0.02) = 5.2 > E = 3.1.
  SpecGateConfig config;
  config.demote_after = 2;
  SpecGateInputs in = Inputs(8, 3000, 2100);
  SpecGateDecision first = DecideSpec(in, config);
  EXPECT_EQ(first.mode, v1::SPECULATIVE);  // hysteresis: 1 of 2
  EXPECT_EQ(first.next_state.below_count, 1u);
  EXPECT_THAT(first.reason, HasSubstr("1 of 2 before demotion"));
  in.state = first.next_state;
  SpecGateDecision second = DecideSpec(in, config);
  EXPECT_EQ(second.mode, v1::BATCHED);
  EXPECT_THAT(second.reason, HasSubstr("demoted after 2 evaluations"));
  EXPECT_EQ(second.batch_size, 8u);
}

TEST(SpecGateTest, LowAcceptanceDemotes) {
  // r = 0.05: E = 1.15 < ratio 1.3 * 0.9 even alone on the worker.
  SpecGateInputs in = Inputs(1, 10000, 500);
  SpecGateDecision d;
  for (int i = 0; i < 3; ++i) {
    d = DecideSpec(in);
    in.state = d.next_state;
  }
  EXPECT_EQ(d.mode, v1::BATCHED);
}

TEST(SpecGateTest, FirstDecisionUnderLoadStartsBatched) {
  SpecGateDecision d = DecideSpec(Inputs(8, 0, 0, v1::DECODE_MODE_UNSPECIFIED));
  EXPECT_EQ(d.mode, v1::BATCHED);
  EXPECT_THAT(d.reason, HasSubstr("plain decode is cheaper"));
  // With no rounds yet, the acceptance is the prior.
  EXPECT_DOUBLE_EQ(d.measured_acceptance, SpecGateConfig().prior_acceptance);
}

TEST(SpecGateTest, GroupedRoundsPayWhileThePassIsMemoryBound) {
  // Batch 8 at k = 1: a group verifies 16 rows, ratio = 0.011 * D(16) /
  // (D(2) * D(8)) = 0.011 * 0.04 / (0.01 * 0.02) = 2.2 > E = 1.7: plain.
  // With a pass flat to 64 rows (a memory-bound GPU at this size) the same
  // group costs V(2) / D(8) = 1.1 plain steps: speculation pays.
  SpecGateInputs in = Inputs(8, 3000, 2100, v1::DECODE_MODE_UNSPECIFIED);
  in.k = 1;
  EXPECT_EQ(DecideSpec(in).mode, v1::BATCHED);
  const std::vector<double> flat(64, 0.010);
  in.decode_seconds_by_batch = flat;
  SpecGateDecision d = DecideSpec(in);
  EXPECT_EQ(d.mode, v1::SPECULATIVE);
  EXPECT_THAT(d.verify_cost_ratio, DoubleNear(1.1, 1e-9));
}

TEST(SpecGateTest, FirstDecisionAloneStartsSpeculative) {
  SpecGateDecision d = DecideSpec(Inputs(1, 0, 0, v1::DECODE_MODE_UNSPECIFIED));
  EXPECT_EQ(d.mode, v1::SPECULATIVE);
}

TEST(SpecGateTest, HysteresisPreventsFlapping) {
  // Load alternates between 2 (gain below 1 - margin) and 1 (clearly
  // good): the below count never reaches demote_after, so no demotion.
  // Batch 2: ratio = 0.013 * D(8) / (D(4) * D(2)) = 2.6; r = 0.35 gives
  // E = 2.05, gain 0.79: below. Batch 1: ratio 1.3, gain 1.58.
  SpecGateInputs in = Inputs(2, 100000, 35000);
  for (int i = 0; i < 20; ++i) {
    in.batch_size = (i % 2 == 0) ? 2 : 1;
    SpecGateDecision d = DecideSpec(in);
    ASSERT_EQ(d.mode, v1::SPECULATIVE) << "evaluation " << i;
    ASSERT_LE(d.next_state.below_count, 1u);
    in.state = d.next_state;
  }
  // Sustained load does demote.
  in.batch_size = 2;
  SpecGateDecision d;
  for (int i = 0; i < 3; ++i) {
    d = DecideSpec(in);
    in.state = d.next_state;
  }
  EXPECT_EQ(d.mode, v1::BATCHED);
}

TEST(SpecGateTest, SmallDipWithinMarginKeepsSpeculating) {
  // gain in [1 - margin, 1): not worth a one-way demotion.
  // Batch 2, r = 0.52: E = 2.56, ratio 2.6, gain 0.985.
  SpecGateInputs in = Inputs(2, 100000, 52000);
  for (int i = 0; i < 10; ++i) {
    SpecGateDecision d = DecideSpec(in);
    ASSERT_EQ(d.mode, v1::SPECULATIVE);
    EXPECT_EQ(d.next_state.below_count, 0u);
    in.state = d.next_state;
  }
}

TEST(SpecGateTest, AcceptanceFollowsTheRecentRounds) {
  // 3000 drafts at r = 0.7, then the drafts stop landing (a change of
  // topic): within ~2 windows of drafted tokens the measured acceptance is
  // near 0 and the session is demoted (a few bursts, the demotion streak
  // included), although its lifetime rate is still above 0.5.
  SpecGateInputs in = Inputs(1, 3000, 2100);
  SpecGateDecision d = DecideSpec(in);
  ASSERT_EQ(d.mode, v1::SPECULATIVE);
  EXPECT_THAT(d.measured_acceptance, DoubleNear(0.7, 0.01));
  int evaluations = 0;
  while (d.mode == v1::SPECULATIVE && evaluations < 100) {
    in.state = d.next_state;
    in.drafted += 96;  // one burst of 32 rounds at k = 3, none accepted
    d = DecideSpec(in);
    ++evaluations;
  }
  EXPECT_EQ(d.mode, v1::BATCHED);
  EXPECT_LE(evaluations, 8);
  EXPECT_LT(d.measured_acceptance, 0.2);
  EXPECT_GT(static_cast<double>(in.accepted) / in.drafted, 0.5);
}

TEST(SpecGateTest, DraftsThatNeverLandDemoteAfterOneBurst) {
  // An untrained draft head: one burst of 32 rounds at k = 3, none accepted.
  // Even the upper bound of 0 of 96 (z = 1.64: 0.027) gives E = 1.08 against
  // a round alone costing 1.3 steps: demoted at that evaluation, no streak.
  SpecGateInputs in = Inputs(1, 96, 0);
  in.state.seen_drafted = 0;
  SpecGateDecision d = DecideSpec(in);
  EXPECT_EQ(d.mode, v1::BATCHED);
  EXPECT_THAT(d.reason, HasSubstr("demoted at once"));
  // Without the rule the prior keeps it speculating for several bursts.
  SpecGateConfig streak_only;
  streak_only.decisive_z = 0;
  EXPECT_EQ(DecideSpec(in, streak_only).mode, v1::SPECULATIVE);
}

TEST(SpecGateTest, LoadAloneNeverDemotesAtOnce) {
  // Good drafts (r = 0.7) under a load where rounds lose: the streak
  // decides, since the same rounds pay alone on the worker.
  SpecGateInputs in = Inputs(16, 3000, 2100);
  SpecGateDecision d = DecideSpec(in);
  ASSERT_LT(d.expected_tokens_per_round / d.verify_cost_ratio, 0.96);
  EXPECT_EQ(d.mode, v1::SPECULATIVE);
  EXPECT_EQ(d.next_state.below_count, 1u);
}

TEST(SpecGateTest, NoRoundsAreNoEvidence) {
  // Verify costs 5 plain steps: even perfect drafts (E = 4) would not pay,
  // but before its first round a speculative session waits for the streak.
  SpecGateInputs in = Inputs(1, 0, 0);
  const std::vector<double> slow_verify(9, 0.05);
  in.verify_seconds_by_columns = slow_verify;
  SpecGateDecision d = DecideSpec(in);
  EXPECT_EQ(d.mode, v1::SPECULATIVE);
  EXPECT_EQ(d.next_state.below_count, 1u);
}

TEST(SpecGateTest, FewDraftsAreNotDecisive) {
  // 0 of 6 drafted: the bound (0.31) still allows a paying round.
  SpecGateInputs in = Inputs(1, 6, 0);
  EXPECT_EQ(DecideSpec(in).mode, v1::SPECULATIVE);
}

TEST(SpecGateModelTest, AcceptanceUpperBound) {
  EXPECT_DOUBLE_EQ(AcceptanceUpperBound(0, 0, 1.64), 1.0);
  EXPECT_THAT(AcceptanceUpperBound(96, 0, 1.64),
              DoubleNear(1.64 * 1.64 / (96 + 1.64 * 1.64), 1e-12));
  EXPECT_GT(AcceptanceUpperBound(1000, 500, 1.64), 0.5);
  EXPECT_LT(AcceptanceUpperBound(1000, 500, 1.64), 0.53);
  EXPECT_GT(AcceptanceUpperBound(10, 5, 1.64),
            AcceptanceUpperBound(1000, 500, 1.64));
}

TEST(SpecGateTest, NoNewRoundsLeaveTheWindowAsItIs) {
  SpecGateInputs in = Inputs(1, 600, 300);
  SpecGateDecision first = DecideSpec(in);
  in.state = first.next_state;
  SpecGateDecision again = DecideSpec(in);
  EXPECT_DOUBLE_EQ(again.measured_acceptance, first.measured_acceptance);
  EXPECT_DOUBLE_EQ(again.next_state.recent_drafted,
                   first.next_state.recent_drafted);
}

TEST(SpecGateTest, RestartedTelemetryCountsAsNew) {
  // A rebuilt session's lifetime counts start again below what was seen.
  SpecGateInputs in = Inputs(1, 6000, 6000);
  in.state = DecideSpec(in).next_state;
  in.drafted = 3000;
  in.accepted = 0;
  SpecGateDecision d = DecideSpec(in);
  EXPECT_EQ(d.next_state.seen_drafted, 3000u);
  EXPECT_LT(d.measured_acceptance, 0.05);
}

TEST(SpecGateTest, DemotedNeverRepromotes) {
  // Perfect acceptance, one session: would pay, but BATCHED is one-way.
  SpecGateDecision d = DecideSpec(Inputs(1, 1000, 1000, v1::BATCHED));
  EXPECT_EQ(d.mode, v1::BATCHED);
  EXPECT_THAT(d.reason, HasSubstr("one-way"));
}

TEST(SpecGateTest, NotRequestedOrNoDraftHead) {
  SpecGateInputs in = Inputs(1, 1000, 900);
  in.speculation_requested = false;
  EXPECT_EQ(DecideSpec(in).mode, v1::BATCHED);
  in.speculation_requested = true;
  in.draft_available = false;
  SpecGateDecision d = DecideSpec(in);
  EXPECT_EQ(d.mode, v1::BATCHED);
  EXPECT_THAT(d.reason, HasSubstr("no draft"));
}

TEST(SpecGateTest, MissingCostsKeepSpeculating) {
  SpecGateInputs in = Inputs(8, 1000, 100);
  in.decode_seconds_by_batch = {};
  in.verify_seconds_by_columns = {};
  SpecGateDecision d = DecideSpec(in);
  EXPECT_EQ(d.mode, v1::SPECULATIVE);
  EXPECT_EQ(d.verify_cost_ratio, 0);
  EXPECT_THAT(d.reason, HasSubstr("no step costs"));
}

TEST(SpecGateTest, PriorDominatesFewRounds) {
  SpecGateConfig config;  // prior 0.6, weight 16
  // 4 drafted, 0 accepted: (0 + 9.6) / 20 = 0.48, not 0.
  EXPECT_DOUBLE_EQ(SmoothedAcceptance(4, 0, config), 0.48);
  // Many rounds: the measurement dominates.
  EXPECT_NEAR(SmoothedAcceptance(100000, 20000, config), 0.2, 1e-3);
  // Inconsistent telemetry is clamped.
  EXPECT_LE(SmoothedAcceptance(10, 50, config), 1.0);
}

TEST(SpecGateTest, ToProtoCarriesInputs) {
  SpecGateDecision d = DecideSpec(Inputs(1, 3000, 2100));
  v1::GateDecision p = d.ToProto();
  EXPECT_EQ(p.mode(), v1::SPECULATIVE);
  EXPECT_DOUBLE_EQ(p.measured_acceptance(), d.measured_acceptance);
  EXPECT_DOUBLE_EQ(p.expected_tokens_per_round(), d.expected_tokens_per_round);
  EXPECT_DOUBLE_EQ(p.verify_cost_ratio(), d.verify_cost_ratio);
  EXPECT_EQ(p.batch_size(), 1u);
  EXPECT_EQ(p.reason(), d.reason);
}

TEST(SpecGateModelTest, CostExtrapolation) {
  const std::vector<double> decode = {1.0, 1.5};
  EXPECT_DOUBLE_EQ(DecodeSeconds(decode, 1), 1.0);
  EXPECT_DOUBLE_EQ(DecodeSeconds(decode, 2), 1.5);
  EXPECT_DOUBLE_EQ(DecodeSeconds(decode, 4), 2.5);  // slope 0.5
  const std::vector<double> one = {2.0};
  EXPECT_DOUBLE_EQ(DecodeSeconds(one, 5), 2.0);  // flat
  EXPECT_DOUBLE_EQ(VerifySeconds(one, 3), 6.0);  // proportional
  EXPECT_DOUBLE_EQ(VerifySeconds({}, 3), 0.0);
  const std::vector<double> falling = {2.0, 1.0};    // noisy measurement
  EXPECT_DOUBLE_EQ(DecodeSeconds(falling, 4), 1.0);  // never decreases
}

TEST(SpecGateModelTest, ChooseKByPositionFollowsTheMeasuredPositions) {
  // Acceptance through position j: 0.8, 0.6, 0.1 (the third draft rarely
  // lands). Alone (b = 1): E(1) = 1.8 / 0.011, E(2) = 2.4 / 0.012,
  // E(3) = 2.5 / 0.013: k = 2 wins.
  const std::vector<uint64_t> drafted = {1000, 1000, 1000};
  const std::vector<uint64_t> accepted = {800, 600, 100};
  EXPECT_EQ(ChooseKByPosition(drafted, accepted, 3, 1, kDecode, kVerify), 2u);
  // Every draft landing: the deepest wins.
  const std::vector<uint64_t> all = {1000, 1000, 1000};
  EXPECT_EQ(ChooseKByPosition(drafted, all, 3, 1, kDecode, kVerify), 3u);
  // Under load the group's rows cost more per column: shallower rounds.
  // b = 8: k = 1 costs 0.011 x D(16)/D(2) = 0.044, k = 2 0.012 x D(24)/D(3)
  // = 0.072: E/cost 40.9 against 33.3.
  EXPECT_EQ(ChooseKByPosition(drafted, accepted, 3, 8, kDecode, kVerify), 1u);
}

TEST(SpecGateModelTest, ChooseKByPositionNeedsEvidenceAtEveryDepth) {
  const std::vector<uint64_t> accepted = {8, 6, 1};
  EXPECT_EQ(ChooseKByPosition({10, 10, 10}, accepted, 3, 1, kDecode, kVerify),
            3u);
  EXPECT_EQ(ChooseKByPosition({1000, 1000}, {800, 600}, 3, 1, kDecode, kVerify),
            3u);
  EXPECT_EQ(
      ChooseKByPosition({1000, 1000, 1000}, {800, 600, 100}, 3, 1, {}, kVerify),
      3u);
}

}  // namespace
}  // namespace specserve::scheduler
