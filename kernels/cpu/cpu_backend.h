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

 protected:
  void Free(void* data) override;

 private:
  // While recording: keeps `op` (to run at Replay) and returns OK.
  absl::Status Record(std::function<absl::Status()> op);

  std::unique_ptr<ThreadPool> pool_;
  const bool can_record_;
  RecordingState recording_{"cpu"};
  std::vector<std::function<absl::Status()>> recorded_;
};

}  // namespace specserve::kernels::cpu

#endif  // SPECSERVE_KERNELS_CPU_CPU_BACKEND_H_
