#include "worker/spec/live_step_costs.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specserve::spec {
namespace {

using ::testing::DoubleNear;
using ::testing::ElementsAre;

TEST(LiveStepCostsTest, WithoutMeasurementsTheStartupTableIsReported) {
  LiveStepCosts c({0.010, 0.011, 0.012}, {0.010, 0.0105});
  const auto t = c.Snapshot();
  EXPECT_THAT(t.decode_seconds_by_batch, ElementsAre(0.010, 0.011, 0.012));
  EXPECT_THAT(t.round_seconds_by_columns, ElementsAre(0.010, 0.0105));
}

TEST(LiveStepCostsTest, MeasuredRowsFollowTheLoadAsMovingAverages) {
  LiveStepCosts c({0.010, 0.011}, {0.010, 0.010}, /*weight=*/0.5);
  c.RecordDecode(2, 0.020);  // the first measurement is taken as it is
  EXPECT_DOUBLE_EQ(c.Snapshot().decode_seconds_by_batch[1], 0.020);
  c.RecordDecode(2, 0.030);  // then half way to each new one
  EXPECT_DOUBLE_EQ(c.Snapshot().decode_seconds_by_batch[1], 0.025);
  // A round of 3 drafts + a 4-column verify lands at index 3.
  c.RecordRound(4, 4, 0.040);
  const auto t = c.Snapshot();
  ASSERT_EQ(t.round_seconds_by_columns.size(), 4u);
  EXPECT_DOUBLE_EQ(t.round_seconds_by_columns[3], 0.040);
}

TEST(LiveStepCostsTest, UnmeasuredRowsAreScaledLikeTheMeasuredOnes) {
  // Serving runs everything at twice the start-up probe's cost (longer
  // contexts): the rows not measured yet double as well, so a comparison of
  // a measured row with an unmeasured one stays fair.
  LiveStepCosts c({0.010, 0.011, 0.012, 0.013}, {0.010, 0.010, 0.010});
  c.RecordDecode(2, 0.022);
  c.RecordDecode(4, 0.026);
  const auto t = c.Snapshot();
  EXPECT_THAT(t.decode_seconds_by_batch,
              ElementsAre(DoubleNear(0.020, 1e-12), 0.022,
                          DoubleNear(0.024, 1e-12), 0.026));
  // Rounds: measured at 3 columns (2 drafts) at 1.5x the bare verify; the
  // others, and a row past the start-up table, are scaled the same way.
  c.RecordRound(3, 3, 0.015);
  c.RecordRound(5, 5, 0.015);
  const auto r = c.Snapshot().round_seconds_by_columns;
  ASSERT_EQ(r.size(), 5u);
  EXPECT_NEAR(r[0], 0.015, 1e-12);
  EXPECT_NEAR(r[1], 0.015, 1e-12);
  EXPECT_DOUBLE_EQ(r[2], 0.015);
  EXPECT_NEAR(r[3], 0.015, 1e-12);
  EXPECT_DOUBLE_EQ(r[4], 0.015);
}

TEST(LiveStepCostsTest, RowsPastTheStartupTableExtrapolateItsSlope) {
  LiveStepCosts c({0.010, 0.012}, {});
  c.RecordDecode(2, 0.012);  // scale 1
  c.RecordDecode(6, 0.020);  // beyond the table: extrapolated 0.020, scale 1
  const auto t = c.Snapshot().decode_seconds_by_batch;
  EXPECT_THAT(t, ElementsAre(DoubleNear(0.010, 1e-12), 0.012,
                             DoubleNear(0.014, 1e-12), DoubleNear(0.016, 1e-12),
                             DoubleNear(0.018, 1e-12), 0.020));
}

TEST(LiveStepCostsTest, WithoutAStartupTableGapsTakeTheNearestMeasuredRow) {
  LiveStepCosts c({}, {});
  c.RecordRound(4, 4, 0.030);
  EXPECT_THAT(c.Snapshot().round_seconds_by_columns,
              ElementsAre(0.030, 0.030, 0.030, 0.030));
  EXPECT_TRUE(c.Snapshot().decode_seconds_by_batch.empty());
}

TEST(LiveStepCostsTest, AGroupedRoundCountsAsItsRoundAlone) {
  // Decode 10 ms up to 4 rows, then 2.5 ms per row: a round of 4 columns
  // that shared a 16-row verify with three others took 40 ms; alone it
  // would have cost 40 x 10 / 40 = 10 ms.
  std::vector<double> decode(64);
  for (int n = 1; n <= 64; ++n) decode[n - 1] = n <= 4 ? 0.010 : 0.0025 * n;
  LiveStepCosts c(decode, {0.010, 0.010, 0.010, 0.010});
  c.RecordRound(4, 16, 0.040);
  EXPECT_NEAR(c.Snapshot().round_seconds_by_columns[3], 0.010, 1e-12);
}

TEST(LiveStepCostsTest, NonsenseMeasurementsAreIgnored) {
  LiveStepCosts c({0.010}, {0.010, 0.010});
  c.RecordDecode(0, 0.5);
  c.RecordDecode(1, -1.0);
  c.RecordDecode(1, std::nan(""));
  c.RecordRound(1, 1, 0.5);  // a round has at least one draft
  const auto t = c.Snapshot();
  EXPECT_THAT(t.decode_seconds_by_batch, ElementsAre(0.010));
  EXPECT_THAT(t.round_seconds_by_columns, ElementsAre(0.010, 0.010));
}

}  // namespace
}  // namespace specserve::spec
