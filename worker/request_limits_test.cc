#include "worker/request_limits.h"

#include "gtest/gtest.h"

namespace specserve::worker {
namespace {

TEST(RequestLimitsTest, RoomForAWholeContextOfIds) {
  // Small contexts (the default model's 4096, Qwen3.5's 262144) stay at
  // gRPC's default of 4 MiB, which holds them many times over.
  EXPECT_EQ(MaxWorkerRequestBytes(4096), 4 << 20);
  EXPECT_EQ(MaxWorkerRequestBytes(262144), 4 << 20);
  // 5 bytes an id plus 1 MiB once that passes 4 MiB.
  EXPECT_EQ(MaxWorkerRequestBytes(1 << 20), 5 * (1 << 20) + (1 << 20));
  EXPECT_EQ(MaxWorkerRequestBytes(0), 4 << 20);
  EXPECT_EQ(MaxWorkerRequestBytes(-1), 4 << 20);
  EXPECT_GT(MaxWorkerRequestBytes(int64_t{1} << 40), 0);  // clamped
}

}  // namespace
}  // namespace specserve::worker
