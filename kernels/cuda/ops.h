// Host launchers of the CUDA backend's kernels, one per op (each defined in
// the .cu file of the same name). A launcher validates its Params with the
// shared Validate() plus the limits of its kernels, enqueues on `stream`,
// never allocates, and returns INVALID_ARGUMENT / UNIMPLEMENTED for inputs it
// cannot run, or the launch error. All pointers are device pointers.
//
// Row invariance (kernels/backend.h): every kernel below computes each row
// (token) with an instruction sequence chosen from the op's shape only (in,
// dim, head_dim, the row's own position...), never from the number of rows
// in the call, so T rows at once are bit-identical to T single-row calls.
#ifndef SPECSERVE_KERNELS_CUDA_OPS_H_
#define SPECSERVE_KERNELS_CUDA_OPS_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"
#include "kernels/attention.h"
#include "kernels/conv1d.h"
#include "kernels/embed.h"
#include "kernels/gated_delta_rule.h"
#include "kernels/matmul.h"
#include "kernels/reduce.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

namespace specserve::kernels::cuda {

// Scratch device memory owned by the backend, used by one op at a time in
// stream order.
struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
};

// Ids must already be known to be in [0, vocab) (the backend checks them on
// the host first); an out-of-range id still never reads outside the table:
// its row is written as NaN.
absl::Status LaunchEmbed(const EmbedParams& p, cudaStream_t stream);

// Weight-streaming GEMV/GEMM for any T (see matmul.cu for the fixed
// reduction order).
absl::Status LaunchMatmul(const MatmulParams& p, cudaStream_t stream);

absl::Status LaunchRmsNorm(const RmsNormParams& p, cudaStream_t stream);
absl::Status LaunchGatedRmsNorm(const GatedRmsNormParams& p,
                                cudaStream_t stream);
absl::Status LaunchRope(const RopeParams& p, cudaStream_t stream);
absl::Status LaunchSwiglu(const SwigluParams& p, cudaStream_t stream);

// Split-KV decode attention; the chunking depends only on each row's number
// of visible cache rows. Needs AttentionWorkspaceBytesPerRow(p) bytes of
// workspace per query row in flight; rows are processed in batches that fit
// `ws` (at least one row must fit, else RESOURCE_EXHAUSTED).
absl::Status LaunchAttention(const AttentionParams& p, const Workspace& ws,
                             cudaStream_t stream);
size_t AttentionWorkspaceBytesPerRow(const AttentionParams& p);

absl::Status LaunchConv1d(const Conv1dParams& p, cudaStream_t stream);
absl::Status LaunchGatedDeltaRule(const GatedDeltaRuleParams& p,
                                  cudaStream_t stream);

absl::Status LaunchArgmax(const ArgmaxParams& p, cudaStream_t stream);
absl::Status LaunchLogSumExp(const LogSumExpParams& p, cudaStream_t stream);
absl::Status LaunchSoftmax(const SoftmaxParams& p, cudaStream_t stream);

}  // namespace specserve::kernels::cuda

#endif  // SPECSERVE_KERNELS_CUDA_OPS_H_
