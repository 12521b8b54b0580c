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

}  // namespace specserve::kernels

#endif  // SPECSERVE_KERNELS_ATTENTION_INPUTS_H_
