#include "kernels/cpu/thread_pool.h"

#include <atomic>
#include <vector>

#include "gtest/gtest.h"

namespace specserve::kernels::cpu {
namespace {

TEST(ThreadPoolTest, RunsEveryIndexOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int n : {0, 1, 2, 7, 100}) {
      std::vector<std::atomic<int>> hits(n);
      for (int rep = 0; rep < 50; ++rep) {
        pool.ParallelFor(n, [&](int64_t i) { hits[i].fetch_add(1); });
      }
      for (int i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 50) << i;
    }
  }
}

}  // namespace
}  // namespace specserve::kernels::cpu
