// The compute-backend interface: memory, copies and every operation the model
// forward needs, each taking its Params struct (declared one op per header
// beside this one). The forward (worker/model) is written only against this
// class; kernels/cpu implements it in fp32 as the reference and CI oracle, and
// kernels/cuda implements the same interface for the GPU.
//
// Contract for every backend:
//  - Ops validate their Params (the shared Validate() functions) and return
//    INVALID_ARGUMENT instead of running on bad input. They never allocate
//    backend memory the caller must free.
//  - Ops are ordered: an op sees the results of every op issued before it on
//    the same backend. CopyToHost returns after the data is on the host.
//  - Row invariance: an op's result for one row (one token, one output) is
//    bit-identical whatever the number of rows in the call, so a verify over T
//    columns reproduces T single-token decodes exactly.
//  - Session batches: Rope, Attention, Conv1d and GatedDeltaRule also take
//    rows of different sessions in one call (per-row positions and cache /
//    state pointers in backend memory, see their headers); each row is
//    bit-identical to a one-row call on its own session.
//  - Prefill forms (PrefillMatmul, PrefillAttention, PrefillGatedDeltaRule):
//    a prompt's rows may run these instead of the exact ops. Each is
//    deterministic and row-invariant (a row's bits depend only on its own
//    inputs, its position and the cache rows it reads, or for the delta rule
//    the state before it, never on the call's other rows or its row
//    count), so a
//    prompt gives the same bits however it is chunked or batched, and stays
//    within the prefill tolerance of the exact op (docs/DESIGN.md, "Prefill
//    tolerance"). By default they are the exact ops (the CPU reference).
#ifndef SPECSERVE_KERNELS_BACKEND_H_
#define SPECSERVE_KERNELS_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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
#include "kernels/types.h"

namespace specserve::kernels {

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu", "cuda".
  virtual std::string name() const = 0;
  // Bytes of device memory free now (what session caches may still take);
  // UNIMPLEMENTED for a backend whose memory is the host's (the CPU).
  virtual absl::StatusOr<uint64_t> FreeDeviceBytes() const {
    return absl::UnimplementedError(name() + " backend: no device memory");
  }

  // ---- Memory. Allocate returns zero-filled memory.
  virtual absl::StatusOr<Buffer> Allocate(size_t bytes) = 0;
  // Convenience: an fp32 buffer of n elements.
  absl::StatusOr<Buffer> AllocateFloats(size_t n) {
    return Allocate(n * sizeof(float));
  }
  // ---- Memory shared between buffers (automatic prefix reuse: a forked
  // session's attention rows below the fork are its source's memory,
  // docs/DESIGN.md "Prefix reuse"). A backend that can map one page into two
  // buffers overrides all three; the defaults share nothing.
  //
  // The page: the bytes of the smallest piece shared (0: nothing shared).
  virtual size_t SharingPageBytes() const { return 0; }
  // A zero-filled buffer whose pages AllocateSharing can lend to another.
  // `share_points`: byte offsets where later AllocateSharing calls of it are
  // expected to end their sharing (the rows forks will resume at); a backend
  // whose sharing is cheaper in larger pieces keeps whole pieces between
  // them. Any offset still shares up to a page at or below it where the
  // backend can.
  virtual absl::StatusOr<Buffer> AllocateShareable(
      size_t bytes, absl::Span<const size_t> share_points) {
    return Allocate(bytes);
  }
  // A shareable buffer of `bytes` whose first `share` bytes, rounded down to
  // whole pages (to whole pieces of `src`), are `src`'s memory (the same
  // bytes, not a copy); the rest is zero-filled. *shared gets the bytes
  // shared: 0 where the backend cannot share or `src` was not made
  // shareable. share <= bytes and <=
  // src.bytes(). The callers keep the invariant that makes this exact: a
  // shared byte is never written while two buffers map it (Unshare first).
  virtual absl::StatusOr<Buffer> AllocateSharing(size_t bytes,
                                                 const Buffer& src,
                                                 size_t share, size_t* shared) {
    *shared = 0;
    return AllocateShareable(bytes, {});
  }
  // Gives `buffer` memory of its own from byte `from` (rounded down to its
  // page) to its end wherever another buffer maps the same pages, holding
  // what it held; a no-op where it shares nothing there. Ordered like a
  // copy: ops issued before it see the old pages, ops after the new.
  virtual absl::Status Unshare(const Buffer& buffer, size_t from) {
    return absl::OkStatus();
  }

  virtual absl::Status CopyToDevice(void* dst, const void* host_src,
                                    size_t bytes) = 0;
  virtual absl::Status CopyToHost(void* host_dst, const void* src,
                                  size_t bytes) = 0;
  virtual absl::Status CopyOnDevice(void* dst, const void* src,
                                    size_t bytes) = 0;
  virtual absl::Status Zero(void* dst, size_t bytes) = 0;
  // Makes a [rows][cols] weight of `dtype` at host address `host` readable
  // by the ops. The CPU backend reads it in place (no copy: `host` must
  // outlive the Weight); others copy it into backend memory.
  virtual absl::StatusOr<Weight> UploadWeight(DType dtype, const void* host,
                                              int64_t rows, int64_t cols) = 0;
  // One [Σ rows][cols] weight made of parts stacked in order (a fused
  // projection: one matmul instead of several over the same x). Always a
  // copy into backend memory (backend.cc), so `parts` need not outlive it.
  struct WeightPart {
    const void* host = nullptr;
    int64_t rows = 0;
  };
  virtual absl::StatusOr<Weight> UploadStackedWeight(
      DType dtype, const std::vector<WeightPart>& parts, int64_t cols);
  // Waits until every issued op has finished.
  virtual absl::Status Synchronize() = 0;

  // ---- Recording: a sequence of ops captured once and replayed (CUDA
  // graphs). Between BeginRecording and EndRecording the ops are recorded,
  // not run. A recording keeps every argument as given, buffer addresses
  // included, so the caller keeps those buffers alive and writes a step's
  // varying inputs into them (with copies issued outside the recording)
  // before each Replay. Host copies, Synchronize and allocation are refused
  // while recording; EndRecording must always follow BeginRecording and
  // returns the first refusal or capture failure (nothing ran).
  // Backends that cannot record (CanRecord() false, the default) return
  // UNIMPLEMENTED.
  class Recording {
   public:
    virtual ~Recording() = default;
  };
  virtual bool CanRecord() const { return false; }
  virtual absl::Status BeginRecording();
  virtual absl::StatusOr<std::unique_ptr<Recording>> EndRecording();
  // Runs a recording of this backend, ordered like any op.
  virtual absl::Status Replay(const Recording& recording);

  // ---- Operations (see each Params header for the exact math).
  virtual absl::Status Embed(const EmbedParams& p) = 0;
  virtual absl::Status Matmul(const MatmulParams& p) = 0;
  virtual absl::Status RmsNorm(const RmsNormParams& p) = 0;
  virtual absl::Status GatedRmsNorm(const GatedRmsNormParams& p) = 0;
  virtual absl::Status Rope(const RopeParams& p) = 0;
  virtual absl::Status Attention(const AttentionParams& p) = 0;
  virtual absl::Status Conv1d(const Conv1dParams& p) = 0;
  virtual absl::Status GatedDeltaRule(const GatedDeltaRuleParams& p) = 0;
  virtual absl::Status Swiglu(const SwigluParams& p) = 0;
  virtual absl::Status Argmax(const ArgmaxParams& p) = 0;
  virtual absl::Status LogSumExp(const LogSumExpParams& p) = 0;
  virtual absl::Status Softmax(const SoftmaxParams& p) = 0;
  virtual absl::Status ScatterRows(const ScatterRowsParams& p) = 0;
  // q_norm, k_norm, RoPE of q and k, the K and V scatters: by default those
  // six ops in that order (backend.cc); a backend overrides it to fuse them
  // with the same bits (kernels/attention_inputs.h).
  virtual absl::Status AttentionInputs(const AttentionInputsParams& p);
  // Conv1d when p.conv is given, GatedDeltaRule, then GatedRmsNorm in place
  // over its output heads: by default those ops in turn (backend.cc); a
  // backend overrides it to fuse them with the same bits
  // (kernels/gated_delta_rule.h).
  virtual absl::Status GatedDeltaRuleNormed(const GatedDeltaRuleNormParams& p);
  // The token each row's sampling config and uniform draw: by default the
  // host filters and draw on a copy of each row (backend.cc); a backend
  // overrides it to sample on the device (kernels/sample_rows.h).
  // FAILED_PRECONDITION when a row's logits hold NaN or inf.
  virtual absl::Status SampleRows(const SampleRowsParams& p);
  // Constrained rows' allowed-token masks, applied in place, and their
  // argmax (kernels/token_mask.h): by default on a host copy of each row,
  // written back (backend.cc); a backend overrides it to mask on the device.
  virtual absl::Status MaskTokens(const TokenMaskParams& p);

  // Element type of the model's KV caches on this backend (AttentionParams
  // kv_dtype, ScatterRowsParams dst_dtype): kF32 or kBF16.
  virtual DType KvCacheDType() const { return DType::kF32; }
  // Element type of the model's delta-rule recurrent states
  // (GatedDeltaRuleParams state_dtype): kF32 or kBF16. The conv states
  // stay fp32 either way.
  virtual DType RecurrentStateDType() const { return DType::kF32; }

  // ---- Prefill forms (see the contract above).
  // Whether they are the exact ops (then prefill == token-by-token decode
  // bit for bit); false where they round differently (bf16 operands, the
  // chunked delta rule), within the tolerance.
  virtual bool ExactPrefill() const { return true; }
  // Matmul with x rounded to one bf16 term after its fused norm or SwiGLU
  // (on a backend that does so; the default is Matmul itself).
  virtual absl::Status PrefillMatmul(const MatmulParams& p) {
    return Matmul(p);
  }
  // Attention of one session's rows (positions == nullptr) on tensor cores
  // where the backend has them; the default is Attention itself.
  virtual absl::Status PrefillAttention(const AttentionParams& p) {
    return Attention(p);
  }
  // PrefillAttention of several sessions' rows, one params each (the same
  // heads, head_dim, strides, cache type and scale; their own rows,
  // positions, q, caches and output): each slice's output bit-identical to
  // PrefillAttention of it alone, in fewer launches where the backend can.
  // The default runs them one by one.
  virtual absl::Status PrefillAttentionSlices(
      absl::Span<const AttentionParams> slices) {
    for (const AttentionParams& p : slices) {
      if (absl::Status s = PrefillAttention(p); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  // The gated delta rule of one session's tokens (states == nullptr, one
  // state slot: state_out_stride 0) in an order that suits many tokens; the
  // default is GatedDeltaRule itself.
  virtual absl::Status PrefillGatedDeltaRule(const GatedDeltaRuleParams& p) {
    return GatedDeltaRule(p);
  }
  // PrefillGatedDeltaRule and Conv1d of several sessions' tokens, one params
  // each (the same heads or channels, strides, weights; their own rows,
  // position, inputs, outputs and state): each session's outputs and state
  // bit-identical to its own call, in fewer launches where the backend can.
  // The defaults run them one by one.
  virtual absl::Status PrefillGatedDeltaRuleSlices(
      absl::Span<const GatedDeltaRuleParams> slices) {
    for (const GatedDeltaRuleParams& p : slices) {
      if (absl::Status s = PrefillGatedDeltaRule(p); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  virtual absl::Status Conv1dSlices(absl::Span<const Conv1dParams> slices) {
    for (const Conv1dParams& p : slices) {
      if (absl::Status s = Conv1d(p); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

 protected:
  friend class Buffer;
  // Releases memory returned by Allocate (called by Buffer only).
  virtual void Free(void* data) = 0;
};

}  // namespace specserve::kernels

#endif  // SPECSERVE_KERNELS_BACKEND_H_
