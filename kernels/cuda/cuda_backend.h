// The CUDA backend: kernels::Backend on one GPU (sm_90a), weights in their
// storage dtype (bf16/f16/f32) in device memory (the bf16 matrices the
// tensor cores read in their tile layout, kernels/cuda/tiled_weight.cuh),
// fp32 activations, caches and states, fp32 accumulation. Built only with
// --config=cuda.
//
// Every op is issued on the backend's own non-blocking stream, in call
// order; ops return after enqueueing (device faults surface at the next
// Synchronize/CopyToHost). CopyToHost, UploadWeight and Synchronize wait
// for the stream; no op does, so a decode step can be recorded as a CUDA
// graph (Backend::BeginRecording). Embed reads the token ids on the device: an
// id outside [0, vocab) gives a NaN row and OUT_OF_RANGE from the next
// Synchronize/CopyToHost (the model validates ids on the host before uploading
// them). Matmul on bf16 weights runs on the tensor cores with x split into
// `matmul_x_splits` bf16 terms (kernels/cuda/matmul_mma.cu). Row invariance
// holds for every op, prefill included: no op switches to a differently-ordered
// kernel for large T (see kernels/cuda/ ops.h), so prefill logits equal decode
// logits bit for bit. Not thread-safe: one caller at a time (any thread; each
// call selects the backend's device).
#ifndef SPECSERVE_KERNELS_CUDA_CUDA_BACKEND_H_
#define SPECSERVE_KERNELS_CUDA_CUDA_BACKEND_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_handles.h"
#include "kernels/cuda/shared_pages.h"
#include "kernels/recording_state.h"

namespace specserve::kernels::cuda {

struct CudaBackendOptions {
  int device = 0;
  // Scratch for split-KV attention, overlapping CopyOnDevice and the
  // tensor-core matmul's K-piece sums. Attention needs
  // num_heads·min(64, ceil(n/16))·(head_dim+2)·4 bytes per query row in
  // flight (≈2.1 MB for 32 heads of 256 at n >= 1K); the matmul needs
  // max_pieces·rows·out floats (127 MB for a 248320-wide lm_head at 64 rows
  // and 2 pieces). Longer calls are split into batches of rows that fit,
  // and a split matmul reads its weights once per batch.
  size_t workspace_bytes = size_t{256} << 20;
  // bf16 terms per fp32 activation on the tensor-core matmul path: 2 (the
  // default) keeps 16 significant bits (relative error <= 2^-17 per x, about
  // fp32 accumulation noise) and does a third fewer tensor-core
  // instructions than 3, which is exact (x = hi + mid + lo); 0 keeps every
  // matmul on the CUDA-core kernel. Part of the reduction order.
  int matmul_x_splits = 2;
  // Element type of the model's KV caches (Backend::KvCacheDType): bf16
  // halves their bytes and what decode attention reads; its keys and values
  // are the fp32 ones rounded to nearest even, which is also what prefill
  // attention feeds its tensor cores, so a prompt's bits do not change.
  // fp32 keeps the caches exact. fp32 stays the default until the bf16
  // kernels have run on a GPU (docs/DESIGN.md "KV cache type").
  DType kv_cache_dtype = DType::kF32;
  // Element type of the delta rule's recurrent states
  // (Backend::RecurrentStateDType): bf16 halves the state each decode step
  // reads and writes; the kernels round the state after every token
  // (kernels/gated_delta_rule.h), so verify == decode and batched == alone
  // still hold bit for bit. fp32, the checkpoints' mamba_ssm_dtype, is the
  // default (docs/DESIGN.md "Recurrent state type").
  DType recurrent_state_dtype = DType::kF32;
};

// Number of usable CUDA devices; 0 when there is no driver or no GPU.
int CudaDeviceCount();

// Destroys the process's context on `device`, freeing all its memory (a
// worker about to exec itself on another model: open driver handles could
// outlive the exec). No CUDA object of the process may be used afterwards.
void ResetCudaDevice(int device);

// FAILED_PRECONDITION when there is no such device (or no driver).
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device);
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(
    const CudaBackendOptions& options);

class CudaBackend : public Backend {
 public:
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  absl::StatusOr<uint64_t> FreeDeviceBytes() const override;
  int device() const { return device_; }
  // The stream every op is issued on (for events, graphs, benchmarks).
  cudaStream_t stream() const { return stream_.get(); }

  absl::StatusOr<Buffer> Allocate(size_t bytes) override;
  // From virtual-memory pages (shared_pages.h) when the device has them and
  // the buffer is large enough that whole pages waste little; otherwise
  // Allocate's (and then shares nothing).
  size_t SharingPageBytes() const override {
    return pages_ != nullptr ? pages_->page() : 0;
  }
  absl::StatusOr<Buffer> AllocateShareable(
      size_t bytes, absl::Span<const size_t> share_points) override;
  absl::StatusOr<Buffer> AllocateSharing(size_t bytes, const Buffer& src,
                                         size_t share, size_t* shared) override;
  // Waits for the stream when it remaps anything (refused while recording).
  absl::Status Unshare(const Buffer& buffer, size_t from) override;
  absl::Status CopyToDevice(void* dst, const void* host_src,
                            size_t bytes) override;
  absl::Status CopyToHost(void* host_dst, const void* src,
                          size_t bytes) override;
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) override;
  absl::Status Zero(void* dst, size_t bytes) override;
  // bf16 matrices with cols % 8 == 0 come back in the tensor-core tile
  // layout (TileForTensorCores) when the matmul runs on the tensor cores;
  // every other weight is row-major.
  absl::StatusOr<Weight> UploadWeight(DType dtype, const void* host,
                                      int64_t rows, int64_t cols) override;
  absl::StatusOr<Weight> UploadStackedWeight(
      DType dtype, const std::vector<WeightPart>& parts, int64_t cols) override;
  // Converts a row-major weight of this backend to the layout UploadWeight
  // gives it (for weights filled on the device, e.g. random benchmark
  // weights), in stream order. Keeps `w` as it is when that layout is
  // row-major; the old storage is freed, and a Weight that shared `w`'s data
  // keeps it.
  absl::Status TileForTensorCores(Weight* w);
  absl::Status Synchronize() override;

  // Recording is stream capture into a CUDA graph (thread-local mode: a
  // call that would break the capture fails instead).
  bool CanRecord() const override { return true; }
  absl::Status BeginRecording() override;
  absl::StatusOr<std::unique_ptr<Recording>> EndRecording() override;
  absl::Status Replay(const Recording& recording) override;

  absl::Status Embed(const EmbedParams& p) override;
  absl::Status Matmul(const MatmulParams& p) override;
  absl::Status RmsNorm(const RmsNormParams& p) override;
  absl::Status GatedRmsNorm(const GatedRmsNormParams& p) override;
  absl::Status Rope(const RopeParams& p) override;
  absl::Status Attention(const AttentionParams& p) override;
  absl::Status Conv1d(const Conv1dParams& p) override;
  absl::Status Conv1dSlices(absl::Span<const Conv1dParams> slices) override;
  absl::Status PrefillGatedDeltaRuleSlices(
      absl::Span<const GatedDeltaRuleParams> slices) override;
  absl::Status GatedDeltaRule(const GatedDeltaRuleParams& p) override;
  absl::Status GatedDeltaRuleNormed(const GatedDeltaRuleNormParams& p) override;
  absl::Status Swiglu(const SwigluParams& p) override;
  absl::Status Argmax(const ArgmaxParams& p) override;
  absl::Status MaskTokens(const TokenMaskParams& p) override;
  absl::Status LogSumExp(const LogSumExpParams& p) override;
  absl::Status Softmax(const SoftmaxParams& p) override;
  DType KvCacheDType() const override { return kv_cache_dtype_; }
  DType RecurrentStateDType() const override { return recurrent_state_dtype_; }
  bool ExactPrefill() const override { return false; }
  absl::Status PrefillMatmul(const MatmulParams& p) override;
  absl::Status PrefillAttention(const AttentionParams& p) override;
  absl::Status PrefillAttentionSlices(
      absl::Span<const AttentionParams> slices) override;
  absl::Status PrefillGatedDeltaRule(const GatedDeltaRuleParams& p) override;
  absl::Status ScatterRows(const ScatterRowsParams& p) override;
  // One kernel where the six ops fuse (ops.h), else the six ops.
  absl::Status AttentionInputs(const AttentionInputsParams& p) override;
  // On the device (sample_rows.cu); a row the device leaves to the host (a
  // top-k or nucleus past its candidates) runs Backend::SampleRows.
  absl::Status SampleRows(const SampleRowsParams& p) override;

 protected:
  void Free(void* data) override;

 private:
  friend absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(
      const CudaBackendOptions& options);
  CudaBackend(int device, CudaStream stream, DeviceMemory workspace,
              size_t workspace_bytes, DeviceMemory matmul_counters,
              DeviceMemory matmul_x_frags, int matmul_x_splits,
              PinnedMemory error_flag);

  // Makes device_ current on the calling thread.
  absl::Status UseDevice() const;
  // After a stream sync: OUT_OF_RANGE (once) if an Embed saw a bad id.
  absl::Status TakeDeviceError();

  const int device_;
  // Declared first: destroyed last, after the memory below is released.
  CudaStream stream_;
  DeviceMemory workspace_;
  const size_t workspace_bytes_;
  DeviceMemory matmul_counters_;  // MmaMatmulCounters() ints, kept zero
  DeviceMemory matmul_x_frags_;   // kMatmulXFragBytes: pre-split x (> 16 rows)
  // Scratch that grows on demand. An outgrown buffer stays allocated: queued
  // ops and recordings may hold its address.
  struct GrowingScratch {
    DeviceMemory memory;
    size_t bytes = 0;
    std::vector<DeviceMemory> retired;
  };
  // Makes `s` hold at least `need` bytes (refused while recording).
  absl::Status Grow(GrowingScratch& s, size_t need, const char* what);
  // Unfused fused-norm matmuls (ops.h MatmulResources).
  GrowingScratch norm_scratch_;
  // The prefill matmul's bf16 x (ops.h LaunchPrefillMatmul).
  GrowingScratch prefill_x_;
  const int matmul_x_splits_;
  DType kv_cache_dtype_ = DType::kF32;         // set by CreateCudaBackend
  DType recurrent_state_dtype_ = DType::kF32;  // set by CreateCudaBackend
  // One pinned int the Embed kernel sets to 1 on a bad id (host-mapped).
  PinnedMemory error_flag_;
  RecordingState recording_{"cuda"};
  // Shareable buffers; null where the device has no virtual memory
  // management. Released before the stream (declared after it).
  std::unique_ptr<SharedPages> pages_;
  // Frees asked for while a step is being recorded wait until the recording
  // ends: sessions are dropped on any thread, outside the model's hold, and
  // an op enqueued on the capturing stream from another thread invalidates
  // the capture (and the free fails). Free checks `capturing_` and enqueues
  // its free under free_mu_, so no free can slip in after a capture began.
  absl::Mutex free_mu_;
  bool capturing_ ABSL_GUARDED_BY(free_mu_) = false;
  std::vector<void*> deferred_frees_ ABSL_GUARDED_BY(free_mu_);
  // Frees `data` on stream_ (free_mu_ held).
  void FreeNowLocked(void* data) ABSL_EXCLUSIVE_LOCKS_REQUIRED(free_mu_);
};

}  // namespace specserve::kernels::cuda

#endif  // SPECSERVE_KERNELS_CUDA_CUDA_BACKEND_H_
