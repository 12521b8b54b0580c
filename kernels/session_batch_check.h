// Test helper shared by the CPU and CUDA op tests: the session-batch mode of
// Rope, ScatterRows + Attention, Conv1d and GatedDeltaRule (one row per
// session, per-row positions and cache/state pointers in backend memory)
// must give, on any backend, results bit-identical (memcmp) to one-row
// calls on each session alone, including the updated states and caches
// (the delta rule on fp32 and on bf16 states).
#ifndef SPECSERVE_KERNELS_SESSION_BATCH_CHECK_H_
#define SPECSERVE_KERNELS_SESSION_BATCH_CHECK_H_

#include "kernels/backend.h"

namespace specserve::kernels {

// Records gtest failures; `seed` picks the random inputs.
void ExpectSessionBatchMatchesAlone(Backend* backend, unsigned seed);

}  // namespace specserve::kernels

#endif  // SPECSERVE_KERNELS_SESSION_BATCH_CHECK_H_
