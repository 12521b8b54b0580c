// The inputs of a full-attention layer after its q|k|v projection, as one
// call: q_norm and k_norm (RmsNorm, in place), RoPE of q and of k (in
// place), then the new keys and values scattered into their caches
// (ScatterRows). Backend::AttentionInputs runs exactly these six ops in this
// order; a backend may run them as one kernel where the six describe the
// same vectors (the CUDA backend does: attention_inputs.cu), with the bits
// of the six ops. One call per layer and step instead of six launches.
#ifndef SPECSERVE_KERNELS_ATTENTION_INPUTS_H_
#define SPECSERVE_KERNELS_ATTENTION_INPUTS_H_

#include "absl/status/status.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/scatter_rows.h"

namespace specserve::kernels {

struct AttentionInputsParams {
  RmsNormParams q_norm;
  RmsNormParams k_norm;
  RopeParams q_rope;
  RopeParams k_rope;
  ScatterRowsParams k_scatter;  // reads k after its norm and RoPE
  ScatterRowsParams v_scatter;
};

// Each of the six Params is valid on its own.
absl::Status Validate(const AttentionInputsParams& p);

// The layout a full-attention layer produces: one projection x[rows][W]
// whose row is [heads × (query head_dim | gate head_dim) | kv_heads keys |
// kv_heads values], W = 2·heads·head_dim + 2·kv_heads·head_dim. The norms
// ((1 + w) weights) and RoPE run in place over the queries and keys; the
// scatters read the keys and values.
struct FusedQkvRows {
  int64_t rows = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;
  float* x = nullptr;             // row 0 of the block of rows
  const float* q_norm = nullptr;  // [head_dim]
  const float* k_norm = nullptr;  // [head_dim]
  float eps = 1e-6f;
  const float* inv_freq = nullptr;  // [rotary_dim / 2]
};

// The six ops' Params over `r`, all but where the rows are: the caller sets
// the positions (q_rope and k_rope: first_position or positions) and the
// scatters' destinations (dst_base and dst_first_row, or dst and dst_rows;
// dst_row_stride is set to kv_heads·head_dim, one dense cache row).
AttentionInputsParams AttentionInputsOf(const FusedQkvRows& r);

}  // namespace specserve::kernels

#endif  // SPECSERVE_KERNELS_ATTENTION_INPUTS_H_
