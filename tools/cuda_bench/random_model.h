// A model of any qwen3_5 shape with random bf16 weights made on the GPU, for
// benchmarks of shapes whose checkpoints cannot be shipped (the 27B shape is
// ~54 GB).
//
// How: WriteSyntheticCheckpoint writes config.json and a *sparse*
// model.safetensors whose every tensor (bf16) overlaps one data region the
// size of the largest tensor; only its first MiB is written (small random
// values, which the vector weights — norms, conv, dt_bias, A_log — read).
// Model::Load over a RandomWeightsBackend then runs the ordinary loader, but
// the backend's UploadWeight ignores the (never-read) host bytes and fills
// each matrix on the GPU with hashed uniform values in [-scale, scale)
// (kernels/cuda LaunchFillRandom, a new seed per matrix). Every other call is
// forwarded to the wrapped CudaBackend (kernels::ForwardingBackend), so the
// forward runs the real kernels.
//
//   SS_RETURN_IF_ERROR(WriteSyntheticCheckpoint(config_json, "/tmp/m27"));
//   RandomWeightsBackend rb(cuda_backend, /*scale=*/0.02f);
//   SS_ASSIGN_OR_RETURN(auto model, model::Model::Load("/tmp/m27", &rb));
#ifndef SPECSERVE_TOOLS_CUDA_BENCH_RANDOM_MODEL_H_
#define SPECSERVE_TOOLS_CUDA_BENCH_RANDOM_MODEL_H_

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/forwarding_backend.h"
#include "kernels/cuda/cuda_backend.h"

namespace specserve::cuda_bench {

// The text config of the Qwen3.5-27B shape (64 layers, every 4th full
// attention, untied 248320 vocab, one MTP layer).
std::string Qwen35_27BConfigJson();

// Writes `dir`/config.json (= config_json) and the sparse model.safetensors
// described above. The file's apparent size is the largest tensor's bytes.
absl::Status WriteSyntheticCheckpoint(const std::string& config_json,
                                      const std::string& dir);

class RandomWeightsBackend : public kernels::ForwardingBackend {
 public:
  RandomWeightsBackend(kernels::cuda::CudaBackend* inner, float scale)
      : ForwardingBackend(inner), inner_(inner), scale_(scale) {}

  // Memory, Synchronize and recordings pass through (ForwardingBackend);
  // the enqueueing calls are counted and, in a timeline, marked.
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override {
    ++ops_;
    return Mark("copy_to_device", inner_->CopyToDevice(dst, src, bytes));
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    if (host_copies_++ == 0) first_host_copy_ = std::chrono::steady_clock::now();
    return inner_->CopyToHost(dst, src, bytes);
  }
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    ++ops_;
    return Mark("copy_on_device", inner_->CopyOnDevice(dst, src, bytes));
  }
  absl::Status Zero(void* dst, size_t bytes) override {
    ++ops_;
    return Mark("zero", inner_->Zero(dst, bytes));
  }
  // Fills on the GPU; `host` is not read.
  absl::StatusOr<kernels::Weight> UploadWeight(kernels::DType dtype, const void* host,
                                               int64_t rows, int64_t cols) override;
  absl::StatusOr<kernels::Weight> UploadStackedWeight(kernels::DType dtype,
                                                      const std::vector<WeightPart>& parts,
                                                      int64_t cols) override;
  // A replay counts as one call.
  absl::Status Replay(const Recording& r) override { ++ops_;
    return Mark("replay", inner_->Replay(r)); }

  absl::Status Embed(const kernels::EmbedParams& p) override { ++ops_;
    return Mark("embed", inner_->Embed(p)); }
  absl::Status Matmul(const kernels::MatmulParams& p) override { ++ops_;
    return Mark(timeline_ ? MatmulName(p) : std::string(), inner_->Matmul(p)); }
  absl::Status RmsNorm(const kernels::RmsNormParams& p) override { ++ops_;
    if (Skipped("rms_norm")) return absl::OkStatus();
    return Mark("rms_norm", inner_->RmsNorm(p)); }
  absl::Status GatedRmsNorm(const kernels::GatedRmsNormParams& p) override {
    ++ops_;
    if (Skipped("gated_rms_norm")) return absl::OkStatus();
    return Mark("gated_rms_norm", inner_->GatedRmsNorm(p));
  }
  absl::Status Rope(const kernels::RopeParams& p) override { ++ops_;
    if (Skipped("rope")) return absl::OkStatus();
    return Mark("rope", inner_->Rope(p)); }
  absl::Status Attention(const kernels::AttentionParams& p) override {
    ++ops_;
    if (Skipped("attention")) return absl::OkStatus();
    return Mark("attention", inner_->Attention(p));
  }
  absl::Status Conv1d(const kernels::Conv1dParams& p) override { ++ops_;
    if (Skipped("conv1d")) return absl::OkStatus();
    return Mark("conv1d", inner_->Conv1d(p)); }
  absl::Status GatedDeltaRule(const kernels::GatedDeltaRuleParams& p) override {
    ++ops_;
    if (Skipped("gated_delta_rule")) return absl::OkStatus();
    return Mark("gated_delta_rule", inner_->GatedDeltaRule(p));
  }
  absl::Status Swiglu(const kernels::SwigluParams& p) override { ++ops_;
    if (Skipped("swiglu")) return absl::OkStatus();
    return Mark("swiglu", inner_->Swiglu(p)); }
  absl::Status Argmax(const kernels::ArgmaxParams& p) override { ++ops_;
    return Mark("argmax", inner_->Argmax(p)); }
  absl::Status LogSumExp(const kernels::LogSumExpParams& p) override {
    ++ops_;
    return Mark("logsumexp", inner_->LogSumExp(p));
  }
  absl::Status Softmax(const kernels::SoftmaxParams& p) override { ++ops_;
    return Mark("softmax", inner_->Softmax(p)); }
  absl::Status ScatterRows(const kernels::ScatterRowsParams& p) override {
    ++ops_;
    if (Skipped("scatter_rows")) return absl::OkStatus();
    return Mark("scatter_rows", inner_->ScatterRows(p));
  }

  absl::Status AttentionInputs(const kernels::AttentionInputsParams& p) override {
    ++ops_;
    if (Skipped("attention_inputs")) return absl::OkStatus();
    return Mark("attention_inputs", inner_->AttentionInputs(p));
  }
  uint64_t filled_bytes() const { return filled_bytes_; }
  // Timing experiments only: the short ops named here (rms_norm, rope,
  // conv1d, swiglu, gated_rms_norm, attention, attention_inputs,
  // gated_delta_rule, scatter_rows) are dropped, not enqueued, so a step without them shows
  // what fusing them away could save at most. Results are then wrong.
  void set_skipped(std::set<std::string> ops) { skipped_ = std::move(ops); }

  // GPU timeline by op (diagnostics): between StartTimeline() and
  // StopTimeline() each call records an event after its work on the
  // backend's stream; with the GPU the bottleneck (queue full), the time
  // between consecutive events is that op's GPU time, launch gap included.
  // StopTimeline synchronizes and returns {op name: (total ms, calls)}.
  void StartTimeline();
  std::map<std::string, std::pair<double, int>> StopTimeline();

  // Step accounting for the benchmark: MarkStep() zeroes the counters;
  // ops() counts the enqueueing calls (kernels and device copies) since,
  // host_copies() the (synchronous) device-to-host copies, and
  // first_host_copy() is when the first of those was entered: until then the
  // host only enqueued work, so (first_host_copy − step start) is the host's
  // enqueue time of the step.
  void MarkStep() {
    ops_ = 0;
    host_copies_ = 0;
  }
  int ops() const { return ops_; }
  int host_copies() const { return host_copies_; }
  std::chrono::steady_clock::time_point first_host_copy() const { return first_host_copy_; }

 private:
  absl::Status Mark(const std::string& name, absl::Status s);
  static std::string MatmulName(const kernels::MatmulParams& p);
  bool Skipped(const char* op) const { return skipped_.count(op) != 0; }

  kernels::cuda::CudaBackend* inner_;  // the forwarded-to backend, typed (stream())
  float scale_;
  bool timeline_ = false;
  std::vector<cudaEvent_t> events_;  // [0] = start
  std::vector<std::string> event_names_;
  size_t used_events_ = 0;
  uint64_t seed_ = 1;
  uint64_t filled_bytes_ = 0;
  int ops_ = 0;
  std::set<std::string> skipped_;
  int host_copies_ = 0;
  std::chrono::steady_clock::time_point first_host_copy_;
};

}  // namespace specserve::cuda_bench

#endif  // SPECSERVE_TOOLS_CUDA_BENCH_RANDOM_MODEL_H_
