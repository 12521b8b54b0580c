#include "tools/cuda_bench/boundary_trace.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/matmul_mma.h"
#include "tools/bench_timing/bench_timing.h"

namespace specserve::cuda_bench {
namespace {

using kernels::cuda::kMmaTraceMaxBlocks;
using kernels::cuda::kMmaTraceStamps;
using kernels::cuda::kMmaTraceTimeBits;
using kernels::cuda::kMmaTraceTimeMask;
using kernels::cuda::MmaTraceLaunch;
using nlohmann::json;

constexpr int kRecords = 512;  // launches traced per step (257 at the 27B shape)

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "boundary trace: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// One launch's blocks: stamps in ns (relative to nothing yet) and SMs.
struct LaunchTimes {
  std::vector<double> start, released, ready, end, issued;
  int max_blocks_per_sm = 0;
  bool complete = true;  // every block wrote every stamp
};

LaunchTimes TimesOf(const uint64_t* rec, int grid) {
  LaunchTimes t;
  std::map<int, int> per_sm;
  for (int b = 0; b < grid; ++b) {
    const uint64_t* s = rec + static_cast<int64_t>(b) * kMmaTraceStamps;
    if (std::count(s, s + kMmaTraceStamps, uint64_t{0}) > 0) {
      t.complete = false;
      continue;
    }
    t.start.push_back(static_cast<double>(s[0] & kMmaTraceTimeMask));
    t.released.push_back(static_cast<double>(s[1] & kMmaTraceTimeMask));
    t.ready.push_back(static_cast<double>(s[2] & kMmaTraceTimeMask));
    t.end.push_back(static_cast<double>(s[3] & kMmaTraceTimeMask));
    t.issued.push_back(static_cast<double>(s[5] & kMmaTraceTimeMask));
    const int sm = static_cast<int>(s[0] >> kMmaTraceTimeBits);
    t.max_blocks_per_sm = std::max(t.max_blocks_per_sm, ++per_sm[sm]);
  }
  return t;
}

// Per-shape sums of a call's intervals (us), averaged when printed.
struct ShapeSums {
  int calls = 0;
  double floor_us = 0, call_us = 0, start_gap_us = 0, start_med_us = 0, issued_us = 0,
         released_us = 0, prologue_us = 0, body_us = 0, tail_us = 0;
  int max_blocks_per_sm = 0;
};

}  // namespace

json TraceBoundaries(const std::function<void()>& step,
                     const std::function<void()>& drop_recorded, double copy_gbs,
                     const std::string& dump_path) {
  const size_t words = static_cast<size_t>(kRecords) * kMmaTraceStamps * kMmaTraceMaxBlocks;
  uint64_t* buffer = nullptr;
  Check(cudaMalloc(reinterpret_cast<void**>(&buffer), words * sizeof(uint64_t)), "cudaMalloc");
  Check(cudaMemset(buffer, 0, words * sizeof(uint64_t)), "cudaMemset");
  kernels::cuda::SetMmaMatmulTraceForBenchmark(buffer, kRecords);
  drop_recorded();
  // The launches are numbered from each step's start: an eager step and the
  // step's recording number them alike; replays launch nothing (and keep
  // the recording's records), so the last non-empty list is the step's.
  std::vector<MmaTraceLaunch> launches;
  for (int i = 0; i < 4; ++i) {
    kernels::cuda::RestartMmaMatmulTrace();
    step();
    if (!kernels::cuda::MmaMatmulTraceLaunches().empty()) {
      launches = kernels::cuda::MmaMatmulTraceLaunches();
    }
  }
  Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::vector<uint64_t> host(words);
  Check(cudaMemcpy(host.data(), buffer, words * sizeof(uint64_t), cudaMemcpyDeviceToHost),
        "cudaMemcpy");
  kernels::cuda::SetMmaMatmulTraceForBenchmark(nullptr, 0);
  drop_recorded();
  if (!dump_path.empty()) {
    // Raw records for offline analysis: per launch int64 in, out, tokens,
    // grid, then grid × kMmaTraceStamps uint64 stamps.
    std::ofstream f(dump_path, std::ios::binary);
    for (size_t i = 0; i < launches.size(); ++i) {
      const int64_t head[4] = {launches[i].in, launches[i].out, launches[i].tokens,
                               launches[i].grid};
      f.write(reinterpret_cast<const char*>(head), sizeof(head));
      f.write(reinterpret_cast<const char*>(host.data() +
                                            i * kMmaTraceStamps * kMmaTraceMaxBlocks),
              static_cast<std::streamsize>(sizeof(uint64_t) * kMmaTraceStamps *
                                           launches[i].grid));
    }
  }
  Check(cudaFree(buffer), "cudaFree");

  // Per call, against the previous matmul call's last block end (the calls
  // between two matmuls, e.g. conv and the delta rule, fall in `released`):
  //   call      = last end - previous last end (the call's share of the step)
  //   start_gap = first block start - previous last end (< 0: resident early)
  //   start_med = median block start - previous last end
  //   issued    = median (ring's first loads issued) - previous last end
  //   released  = median release from the wait - previous last end
  //   prologue  = median (ready - released): the fused norm's 1/rms
  //   body      = median end - median ready: units, staging, piece sums
  //   tail      = last end - median end
  std::map<std::pair<int64_t, int64_t>, ShapeSums> shapes;
  double prev_end = 0, total_call = 0, total_floor = 0, timer_step = 1e30;
  int traced = 0, incomplete = 0;
  for (size_t i = 0; i < launches.size(); ++i) {
    const MmaTraceLaunch& l = launches[i];
    const LaunchTimes t =
        TimesOf(host.data() + i * kMmaTraceStamps * kMmaTraceMaxBlocks, l.grid);
    if (!t.complete || t.start.empty()) {
      ++incomplete;
      prev_end = 0;
      continue;
    }
    std::vector<double> starts = t.start;
    std::sort(starts.begin(), starts.end());
    for (size_t b = 1; b < starts.size(); ++b) {
      if (starts[b] > starts[b - 1]) timer_step = std::min(timer_step, starts[b] - starts[b - 1]);
    }
    const double first_start = starts.front();
    const double last_end = *std::max_element(t.end.begin(), t.end.end());
    const double med_released = bench::Median(t.released), med_ready = bench::Median(t.ready),
                 med_end = bench::Median(t.end);
    const double floor_us = 2.0 * l.in * l.out / (copy_gbs * 1e3);
    if (prev_end > 0) {
      ShapeSums& s = shapes[{l.out, l.in}];
      ++s.calls;
      s.floor_us += floor_us;
      s.call_us += (last_end - prev_end) / 1e3;
      s.start_gap_us += (first_start - prev_end) / 1e3;
      s.start_med_us += (bench::Median(t.start) - prev_end) / 1e3;
      s.issued_us += (bench::Median(t.issued) - prev_end) / 1e3;
      s.released_us += (med_released - prev_end) / 1e3;
      s.prologue_us += (med_ready - med_released) / 1e3;
      s.body_us += (med_end - med_ready) / 1e3;
      s.tail_us += (last_end - med_end) / 1e3;
      s.max_blocks_per_sm = std::max(s.max_blocks_per_sm, t.max_blocks_per_sm);
      total_call += (last_end - prev_end) / 1e3;
      total_floor += floor_us;
      ++traced;
    }
    prev_end = last_end;
  }
  std::printf("    boundary trace of the greedy step (%zu matmul launches, %d timed against the "
              "previous one, %d incomplete; timer step >= %.0f ns; us per call, means per "
              "shape; floor = weight bytes at the copy bandwidth):\n",
              launches.size(), traced, incomplete, timer_step < 1e29 ? timer_step : 0.0);
  std::printf("      %-16s %5s %8s %8s %9s %9s %8s %9s %9s %8s %8s %6s\n", "[out][in]", "calls",
              "floor", "call", "start_gap", "start_med", "issued", "released", "prologue", "body",
              "tail", "blk/SM");
  json out = json::array();
  for (const auto& [shape, s] : shapes) {
    const double n = s.calls;
    const std::string name =
        "[" + std::to_string(shape.first) + "][" + std::to_string(shape.second) + "]";
    std::printf("      %-16s %5d %8.1f %8.1f %9.1f %9.1f %8.1f %9.1f %9.1f %8.1f %8.1f %6d\n",
                name.c_str(), s.calls, s.floor_us / n, s.call_us / n, s.start_gap_us / n,
                s.start_med_us / n, s.issued_us / n, s.released_us / n, s.prologue_us / n,
                s.body_us / n, s.tail_us / n, s.max_blocks_per_sm);
    out.push_back({{"shape", name},
                   {"calls", s.calls},
                   {"floor_us", s.floor_us / n},
                   {"call_us", s.call_us / n},
                   {"start_gap_us", s.start_gap_us / n},
                   {"start_med_us", s.start_med_us / n},
                   {"issued_us", s.issued_us / n},
                   {"released_us", s.released_us / n},
                   {"prologue_us", s.prologue_us / n},
                   {"body_us", s.body_us / n},
                   {"tail_us", s.tail_us / n},
                   {"max_blocks_per_sm", s.max_blocks_per_sm}});
  }
  std::printf("      all timed calls: %.1f us against a floor of %.1f us (the calls between "
              "matmuls included)\n",
              total_call, total_floor);
  return {{"shapes", out}, {"total_call_us", total_call}, {"total_floor_us", total_floor},
          {"launches", launches.size()}, {"incomplete", incomplete}};
}

}  // namespace specserve::cuda_bench
