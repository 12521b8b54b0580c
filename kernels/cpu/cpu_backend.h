// The CPU reference backend: fp32 math on host memory, weights read in place
// in their storage dtype (bf16/f16 widened exactly as they are loaded). The
// oracle in CI and the reference the CUDA backend is checked against.
// Ops run synchronously on the calling thread plus a small persistent thread
// pool that only splits independent outputs, so results are identical for
// any thread count. Not thread-safe: one caller at a time.
#ifndef SPECSERVE_KERNELS_CPU_CPU_BACKEND_H_
#define SPECSERVE_KERNELS_CPU_CPU_BACKEND_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/recording_state.h"

namespace specserve::kernels::cpu {

struct CpuBackendOptions {
  // Threads for data-parallel ops, the caller included; 0 = one per core.
  int num_threads = 0;
  // CanRecord(): recordings (op closures replayed in order) save no time on
  // the CPU, so a serving CPU backend runs op by op; the model tests turn
  // this on to check that recorded steps bake in nothing step-specific.
  bool recording = false;
  // PrefillGatedDeltaRule runs the chunked form (chunked_delta_rule.h: the
  // algorithm of the CUDA prefill and of transformers' no-cache forward)
  // on one session's tokens (a single state slot; anything else runs the
  // exact rule), and ExactPrefill() is false: a prompt's prefill is then
  // within the chunked form's fp32 tolerance of token-by-token decode, not
  // equal to it, yet deterministic, row-invariant and the same bits for
  // passes cut at multiples of kPrefillDeltaRuleChunk positions. For tests
  // of the chunked algorithm (HF parity, an oracle for the CUDA form). Off,
  // every prefill form is the exact op and prefill == decode bit for bit,
  // which the exactness tests rely on.
  bool chunked_prefill = false;
  // Element type of the model's KV caches (Backend::KvCacheDType): fp32, the
  // reference; bf16 rounds each key and value as CUDA's bf16 cache does,
  // so the CPU checks that configuration too.
  DType kv_cache_dtype = DType::kF32;
  // Element type of the delta rule's recurrent states
  // (Backend::RecurrentStateDType): fp32, the reference and the
  // checkpoints' mamba_ssm_dtype; bf16 rounds the state after every token
  // as CUDA's bf16 state does (kernels/gated_delta_rule.h). fp32 or bf16
  // only: anything else fails the constructor's CHECK.
  DType recurrent_state_dtype = DType::kF32;
};

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options = {});
  ~CpuBackend() override;

  std::string name() const override { return "cpu"; }
  int num_threads() const { return pool_->num_threads(); }

  absl::StatusOr<Buffer> Allocate(size_t bytes) override;
  absl::Status CopyToDevice(void* dst, const void* host_src,
                            size_t bytes) override;
  absl::Status CopyToHost(void* host_dst, const void* src,
                          size_t bytes) override;
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) override;
  absl::Status Zero(void* dst, size_t bytes) override;
  absl::StatusOr<Weight> UploadWeight(DType dtype, const void* host,
                                      int64_t rows, int64_t cols) override;
  absl::Status Synchronize() override;

  // Recording (CpuBackendOptions.recording) keeps each op as a closure over
  // its params (copied) and Replay runs them in order: the CPU's command
  // buffer, under the contract of kernels/backend.h (ops validate when
  // recorded; host copies, allocation and Synchronize are refused while
  // recording).
  bool CanRecord() const override { return can_record_; }
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
  absl::Status GatedDeltaRule(const GatedDeltaRuleParams& p) override;
  absl::Status Swiglu(const SwigluParams& p) override;
  absl::Status Argmax(const ArgmaxParams& p) override;
  absl::Status LogSumExp(const LogSumExpParams& p) override;
  absl::Status Softmax(const SoftmaxParams& p) override;
  absl::Status ScatterRows(const ScatterRowsParams& p) override;

  // Prefill forms: the exact ops unless CpuBackendOptions.chunked_prefill.
  bool ExactPrefill() const override { return !chunked_prefill_; }
  DType KvCacheDType() const override { return kv_cache_dtype_; }
  DType RecurrentStateDType() const override { return recurrent_state_dtype_; }
  absl::Status PrefillGatedDeltaRule(const GatedDeltaRuleParams& p) override;

 protected:
  void Free(void* data) override;

 private:
  // While recording: keeps `op` (to run at Replay) and returns OK.
  absl::Status Record(std::function<absl::Status()> op);

  std::unique_ptr<ThreadPool> pool_;
  const bool can_record_;
  const bool chunked_prefill_;
  const DType kv_cache_dtype_;
  const DType recurrent_state_dtype_;
  RecordingState recording_{"cpu"};
  std::vector<std::function<absl::Status()>> recorded_;
};

}  // namespace specserve::kernels::cpu

#endif  // SPECSERVE_KERNELS_CPU_CPU_BACKEND_H_
