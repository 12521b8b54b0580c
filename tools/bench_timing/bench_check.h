// The benchmark programs' check of a call that must succeed for their
// figures to mean anything: a failed absl::Status (or StatusOr) prints where
// and why, and the program exits 1. Benchmarks exit; tests assert.
#ifndef SPECSERVE_TOOLS_BENCH_TIMING_BENCH_CHECK_H_
#define SPECSERVE_TOOLS_BENCH_TIMING_BENCH_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define BENCH_CHECK(expr)                                               \
  do {                                                                  \
    const auto bench_status_ = (expr);                                  \
    if (!bench_status_.ok()) {                                          \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, \
                   bench_status_.ToString().c_str());                   \
      std::exit(1);                                                     \
    }                                                                   \
  } while (0)

#endif  // SPECSERVE_TOOLS_BENCH_TIMING_BENCH_CHECK_H_
