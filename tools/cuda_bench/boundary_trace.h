// The boundary trace of a decode step (cuda_bench --trace_boundaries): for
// every tensor-core matmul call of the step, when its blocks started, were
// released by the wait on the previous kernel, finished their prologue, and
// ended (matmul_mma.h, SetMmaMatmulTraceForBenchmark), against the previous
// matmul call's last block: where the time between a call's bytes at the
// streaming rate and its share of the step goes. A diagnostic: the traced
// kernel (an instance of its own) carries six timer stores per block.
#ifndef SPECSERVE_TOOLS_CUDA_BENCH_BOUNDARY_TRACE_H_
#define SPECSERVE_TOOLS_CUDA_BENCH_BOUNDARY_TRACE_H_

#include <functional>
#include <string>

#include "nlohmann/json.hpp"

namespace specserve::cuda_bench {

// Runs `step` (one decode step, recorded as the model records it) a few
// times with the trace on (`drop_recorded` before and after, so that the
// recorded step is made with and then without the trace's records), prints
// the table and returns it as JSON. `copy_gbs`: the run's copy bandwidth
// (read + write), for the floor column. `dump_path` (if not empty): the raw
// records (tools/cuda_bench/boundary_tails.py reads them).
nlohmann::json TraceBoundaries(const std::function<void()>& step,
                               const std::function<void()>& drop_recorded, double copy_gbs,
                               const std::string& dump_path);

}  // namespace specserve::cuda_bench

#endif  // SPECSERVE_TOOLS_CUDA_BENCH_BOUNDARY_TRACE_H_
