// Timing helpers for the benchmark programs: medians, so one slow repetition
// (a page fault, a context switch) does not move the figure.
#ifndef SPECSERVE_TOOLS_BENCH_TIMING_BENCH_TIMING_H_
#define SPECSERVE_TOOLS_BENCH_TIMING_BENCH_TIMING_H_

#include <algorithm>
#include <chrono>
#include <vector>

namespace specserve::bench {

// The upper median (0 for none).
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Median wall-clock ms of `reps` calls of fn after `warm` untimed ones; fn
// must finish its work before returning (a host sync for device work).
template <typename Fn>
double WallMs(int warm, int reps, Fn fn) {
  for (int i = 0; i < warm; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return Median(ms);
}

}  // namespace specserve::bench

#endif  // SPECSERVE_TOOLS_BENCH_TIMING_BENCH_TIMING_H_
