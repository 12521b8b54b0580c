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
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/attention.h"
#include "kernels/attention_inputs.h"
#include "kernels/conv1d.h"
#include "kernels/embed.h"
#include "kernels/gated_delta_rule.h"
#include "kernels/matmul.h"
#include "kernels/reduce.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/sample_rows.h"
#include "kernels/scatter_rows.h"
#include "kernels/swiglu.h"
#include "kernels/token_mask.h"

namespace specserve::kernels::cuda {

// Scratch device memory owned by the backend, used by one op at a time in
// stream order.
struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
};

// Copies bytes <= kInlineCopyBytes from host memory inside a kernel's
// arguments (asynchronous; the host buffer may be reused at once).
constexpr size_t kInlineCopyBytes = 1024;
absl::Status LaunchInlineCopy(void* dst, const void* host_src, size_t bytes,
                              cudaStream_t stream);
absl::Status LaunchScatterRows(const ScatterRowsParams& p, cudaStream_t stream);

// Ids are read on the device: an out-of-range id never reads outside the
// table; its row is written as NaN and *error (device memory, nullable) is
// set to 1, for the backend to report at its next synchronization.
absl::Status LaunchEmbed(const EmbedParams& p, int* error, cudaStream_t stream);

// What the matmul needs beside its Params: scratch for K-segment partial
// sums, MmaMatmulCounters() ints of zeroed device memory (each launch leaves
// them zero), and the number of bf16 terms x is split into on the tensor
// core path (2 or 3; 0 = CUDA cores only). One backend must use one value
// for all calls (it is part of the reduction order).
struct MatmulResources {
  Workspace ws;
  int* counters = nullptr;
  int x_splits = 2;
  // The tensor-core matmul's pre-split x for more than 16 rows
  // (LaunchMmaMatmul); may be empty.
  Workspace x_frags;
  // A fused-norm matmul the tensor-core kernel does not fuse (more than
  // kMaxFusedNormRows rows, or another path) normalises x here first:
  // needs rows·in floats.
  Workspace norm_scratch;
};

// Rows up to which the tensor-core matmul applies a fused norm itself.
constexpr int64_t kMaxFusedNormRows = 8;

// The tensor-core tile layout of bf16 weights (tiled_weight.cuh): which
// weights the backend keeps in it, its size, and the conversion from
// row-major (`dst`: TiledWeightBytes of zeroed memory).
bool TilesForTensorCores(DType dtype, int64_t cols);
size_t TiledWeightBytes(int64_t rows, int64_t cols);
absl::Status LaunchTileWeight(const void* src, int64_t rows, int64_t cols,
                              void* dst, cudaStream_t stream);

// Weight-streaming GEMV/GEMM for any T (see matmul.cu and matmul_mma.cu
// for the fixed reduction orders).
absl::Status LaunchMatmul(const MatmulParams& p, const MatmulResources& r,
                          cudaStream_t stream);

// The prefill matmul (prefill_matmul.cu): x after its fused norm or SwiGLU
// rounded to one bf16 term (written to `x_bf16`, PrefillMatmulScratchBytes
// of it), then y (+)= x·Wᵀ on the tensor cores with fp32 accumulation, each
// output's reduction order fixed by `in` alone (row-invariant, no split over
// k that depends on the rows). Only for bf16 weights in the tile layout
// (PrefillMatmulApplies); UNIMPLEMENTED otherwise.
bool PrefillMatmulApplies(const MatmulParams& p);
size_t PrefillMatmulScratchBytes(const MatmulParams& p);
absl::Status LaunchPrefillMatmul(const MatmulParams& p, const Workspace& x_bf16,
                                 cudaStream_t stream);

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
// Whether the call's partials run on the tiled kernel (attention_tiled.cuh:
// a bf16 cache of aligned rows, head_dim 64, 128 or 256, up to 8 query heads
// per KV head), a function of the call's shape only.
bool AttentionTiledApplies(const AttentionParams& p);

// Causal flash attention of one session's rows (prefill_attention.cu): q, k
// and v rounded to bf16 on the tensor cores, an online softmax in fp32 over
// key blocks at fixed absolute positions, so each row's bits depend only on
// its q, its position and the cache rows 0..position (row-invariant). Not
// for session batches (positions != nullptr: UNIMPLEMENTED). No workspace.
absl::Status LaunchPrefillAttention(const AttentionParams& p,
                                    cudaStream_t stream);
// LaunchPrefillAttention of several slices (one session's rows each) in as
// few launches as the slice table allows, each slice's output bit-identical
// to its own launch. The slices share heads, head_dim, strides, cache type
// and scale (INVALID_ARGUMENT otherwise); UNIMPLEMENTED as the one-slice
// form, decided for every slice before any launch.
absl::Status LaunchPrefillAttentionSlices(
    absl::Span<const AttentionParams> slices, cudaStream_t stream);

// The six ops of AttentionInputs as one kernel, when they describe one
// layout (FusesAttentionInputs: each norm in place over its rope's head
// vectors, key heads back to back, the scatters reading rotated keys and
// values of the same rows and width); INVALID_ARGUMENT otherwise.
bool FusesAttentionInputs(const AttentionInputsParams& p);
absl::Status LaunchAttentionInputs(const AttentionInputsParams& p,
                                   cudaStream_t stream);

absl::Status LaunchConv1d(const Conv1dParams& p, cudaStream_t stream);
// Conv1d of several sessions' chunks (one state slot each, kernel 4), one
// grid slice per session, each chunk's outputs and state bit-identical to
// its own call. The chunks share channels, kernel, strides, weights and
// activation (INVALID_ARGUMENT otherwise); UNIMPLEMENTED for other shapes,
// decided before any launch.
absl::Status LaunchConv1dSlices(absl::Span<const Conv1dParams> slices,
                                cudaStream_t stream);
// The gated delta rule for many tokens of one session
// (prefill_gated_delta_rule.cu): each warp carries a few state columns of
// one head through all T tokens with warp-shuffle reductions and no block
// barrier, so the per-token chain is short. Fixed order per (dk, dv): any
// split of the tokens into calls gives the same bits. Single slot only
// (state_out_stride 0, states == nullptr); UNIMPLEMENTED otherwise.
absl::Status LaunchPrefillGatedDeltaRule(const GatedDeltaRuleParams& p,
                                         cudaStream_t stream);
// The chunked form (prefill_chunked_delta_rule.cu): chunks of
// kPrefillDeltaRuleChunk tokens at absolute positions (p.position) on the
// tensor cores in tf32, within tolerance of the per-token rule; the same
// prompt split into calls at chunk boundaries gives one call's bits. dk =
// 128, dv % 64 == 0, a single state slot; UNIMPLEMENTED otherwise.
absl::Status LaunchPrefillChunkedDeltaRule(const GatedDeltaRuleParams& p,
                                           cudaStream_t stream);
// LaunchPrefillChunkedDeltaRule of several sessions' calls (one state slot
// each) in as few launches as the slice table allows, each call's outputs
// and state bit-identical to its own launch. The calls share heads,
// strides, gates and state type (INVALID_ARGUMENT otherwise);
// UNIMPLEMENTED as the one-call form, decided before any launch.
absl::Status LaunchPrefillChunkedDeltaRuleSlices(
    absl::Span<const GatedDeltaRuleParams> slices, cudaStream_t stream);
absl::Status LaunchGatedDeltaRule(const GatedDeltaRuleParams& p,
                                  cudaStream_t stream);
// The rule and its gated norm in one kernel (gated_delta_rule.cu), for one
// token (one session, or a session batch of one row) of the hot shape
// (dk = dv = 128) with the norm in
// place over the rule's output heads (FusesGatedDeltaRuleNorm);
// INVALID_ARGUMENT otherwise. The conv, when given, runs inside that kernel
// too where its kernel is 4 and nv/nk <= 4, otherwise just before it.
bool FusesGatedDeltaRuleNorm(const GatedDeltaRuleNormParams& p);
absl::Status LaunchGatedDeltaRuleNormed(const GatedDeltaRuleNormParams& p,
                                        cudaStream_t stream);

// n elements of `dtype` at dst = scale·u, u uniform in [-1, 1) from a hash
// of (seed, index): random benchmark weights made on the GPU.
absl::Status LaunchFillRandom(DType dtype, void* dst, int64_t n, uint64_t seed,
                              float scale, cudaStream_t stream);

absl::Status LaunchArgmax(const ArgmaxParams& p, cudaStream_t stream);

// SampleRows on the device (sample_rows.cu). One row's arguments, packed on
// the host: its logits at x + x_offset, its filters and uniform.
struct SampleRowArgs {
  int64_t x_offset;
  float temperature;
  int32_t top_k;
  float top_p;
  float min_p;
  float uniform;
};
// Each row's outcome, beside its token.
constexpr int32_t kSampledOnDevice = 0;
constexpr int32_t kSampleNonFinite = 1;  // NaN or inf in the row
// Ids of the filters' order a row sorts on the device (a top-k above it, or
// a nucleus that does not close within it, is cut without sorting).
constexpr int kMaxSampleCandidates = 1024;
// Rows one launch can take within `ws` (0 when not even one fits).
int64_t SampleRowsMaxRows(int64_t cols, const Workspace& ws);
// Copies host_args in, runs the kernels, copies [rows tokens | rows outcomes]
// to host_out; the caller synchronizes the stream before reading it.
absl::Status LaunchSampleRows(const SampleRowArgs* host_args, int64_t rows,
                              int64_t cols, const float* x, const Workspace& ws,
                              int32_t* host_out, cudaStream_t stream);
// MaskTokens: copies the row indices and masks into `ws` (in groups that fit
// it), then masks each row in place and writes its argmax.
absl::Status LaunchMaskTokens(const TokenMaskParams& p, const Workspace& ws,
                              cudaStream_t stream);
absl::Status LaunchLogSumExp(const LogSumExpParams& p, cudaStream_t stream);
absl::Status LaunchSoftmax(const SoftmaxParams& p, cudaStream_t stream);

}  // namespace specserve::kernels::cuda

#endif  // SPECSERVE_KERNELS_CUDA_OPS_H_
