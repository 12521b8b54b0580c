// Causal depthwise 1-D convolution over time with a carried state, then SiLU
// (the GDN short convolution):
//   y_t[c] = silu(Σ_{j<K} w[c][j]·m_{t−K+1+j}[c])
// where m are the raw inputs and positions before this call come from the
// state, which holds the last K−1 raw inputs per channel: state[c][K−2] is the
// newest. Zeros before the sequence start (a fresh state is all zeros).
//
// State snapshots: the state after token t is written to
// state_out + t·state_out_stride. With state_out_stride == 0 every token
// writes the same slot (the final state); with state_out == state_in that is
// the in-place decode/prefill update. Verify passes a capture buffer and a
// stride of one state, keeping the state after every column. Each token's
// arithmetic is identical in all modes.
//
// Session batch (states != nullptr; DecodeBatch): row t is one token of its
// own session, whose state states[t] (an array in backend memory) is read
// and updated in place; state_in, state_out and state_out_stride are unused
// (stride must be 0). Row t is bit-identical to a one-row in-place call.
#ifndef SPECSERVE_KERNELS_CONV1D_H_
#define SPECSERVE_KERNELS_CONV1D_H_

#include <cstdint>

#include "absl/status/status.h"

namespace specserve::kernels {

struct Conv1dParams {
  int64_t rows = 0;          // T
  int64_t channels = 0;      // C
  int64_t kernel = 0;        // K >= 2
  const float* x = nullptr;  // [T][x_stride] raw inputs
  int64_t x_stride = 0;
  float* y = nullptr;  // [T][y_stride]; must not overlap x
  int64_t y_stride = 0;
  const float* weight = nullptr;    // [C][K] fp32
  const float* state_in = nullptr;  // [C][K−1]
  float* state_out = nullptr;       // [C][K−1] per snapshot
  int64_t state_out_stride = 0;     // elements; 0 = single slot
  bool silu = true;
  float* const* states = nullptr;  // session batch: [rows] state pointers
};

absl::Status Validate(const Conv1dParams& p);

}  // namespace specserve::kernels

#endif  // SPECSERVE_KERNELS_CONV1D_H_
