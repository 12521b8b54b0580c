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
    return Enqueue("copy_to_device", [&] { return inner_->CopyToDevice(dst, src, bytes); });
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    if (host_copies_++ == 0) first_host_copy_ = std::chrono::steady_clock::now();
    return inner_->CopyToHost(dst, src, bytes);
  }
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    return Enqueue("copy_on_device", [&] { return inner_->CopyOnDevice(dst, src, bytes); });
  }
  absl::Status Zero(void* dst, size_t bytes) override {
    return Enqueue("zero", [&] { return inner_->Zero(dst, bytes); });
  }
  // Fills on the GPU; `host` is not read.
  absl::StatusOr<kernels::Weight> UploadWeight(kernels::DType dtype, const void* host,
                                               int64_t rows, int64_t cols) override;
  absl::StatusOr<kernels::Weight> UploadStackedWeight(kernels::DType dtype,
                                                      const std::vector<WeightPart>& parts,
                                                      int64_t cols) override;
  // A replay counts as one call.
  absl::Status Replay(const Recording& r) override {
    return Enqueue("replay", [&] { return inner_->Replay(r); });
  }

  absl::Status Embed(const kernels::EmbedParams& p) override {
    return Enqueue("embed", [&] { return inner_->Embed(p); });
  }
  absl::Status Matmul(const kernels::MatmulParams& p) override {
    return Enqueue(timeline_ ? MatmulName(p) : std::string("matmul"),
                   [&] { return inner_->Matmul(p); });
  }
  absl::Status PrefillMatmul(const kernels::MatmulParams& p) override {
    return Enqueue(timeline_ ? "prefill_" + MatmulName(p) : std::string("prefill_matmul"),
                   [&] { return inner_->PrefillMatmul(p); });
  }
  absl::Status PrefillAttention(const kernels::AttentionParams& p) override {
    return Enqueue("prefill_attention", [&] { return inner_->PrefillAttention(p); });
  }
  absl::Status PrefillAttentionSlices(
      absl::Span<const kernels::AttentionParams> slices) override {
    return Enqueue("prefill_attention_slices",
                   [&] { return inner_->PrefillAttentionSlices(slices); });
  }
  absl::Status PrefillGatedDeltaRule(const kernels::GatedDeltaRuleParams& p) override {
    return Enqueue("prefill_gated_delta_rule",
                   [&] { return inner_->PrefillGatedDeltaRule(p); });
  }
  absl::Status RmsNorm(const kernels::RmsNormParams& p) override {
    return Enqueue("rms_norm", [&] { return inner_->RmsNorm(p); });
  }
  absl::Status GatedRmsNorm(const kernels::GatedRmsNormParams& p) override {
    return Enqueue("gated_rms_norm", [&] { return inner_->GatedRmsNorm(p); });
  }
  absl::Status Rope(const kernels::RopeParams& p) override {
    return Enqueue("rope", [&] { return inner_->Rope(p); });
  }
  absl::Status Attention(const kernels::AttentionParams& p) override {
    return Enqueue("attention", [&] { return inner_->Attention(p); });
  }
  absl::Status Conv1d(const kernels::Conv1dParams& p) override {
    return Enqueue("conv1d", [&] { return inner_->Conv1d(p); });
  }
  absl::Status Conv1dSlices(absl::Span<const kernels::Conv1dParams> slices) override {
    return Enqueue("conv1d_slices", [&] { return inner_->Conv1dSlices(slices); });
  }
  absl::Status PrefillGatedDeltaRuleSlices(
      absl::Span<const kernels::GatedDeltaRuleParams> slices) override {
    return Enqueue("prefill_gated_delta_rule_slices",
                   [&] { return inner_->PrefillGatedDeltaRuleSlices(slices); });
  }
  absl::Status GatedDeltaRule(const kernels::GatedDeltaRuleParams& p) override {
    return Enqueue("gated_delta_rule", [&] { return inner_->GatedDeltaRule(p); });
  }
  absl::Status GatedDeltaRuleNormed(const kernels::GatedDeltaRuleNormParams& p) override {
    return Enqueue("gated_delta_rule_normed", [&] { return inner_->GatedDeltaRuleNormed(p); });
  }
  absl::Status Swiglu(const kernels::SwigluParams& p) override {
    return Enqueue("swiglu", [&] { return inner_->Swiglu(p); });
  }
  absl::Status Argmax(const kernels::ArgmaxParams& p) override {
    return Enqueue("argmax", [&] { return inner_->Argmax(p); });
  }
  absl::Status LogSumExp(const kernels::LogSumExpParams& p) override {
    return Enqueue("logsumexp", [&] { return inner_->LogSumExp(p); });
  }
  absl::Status Softmax(const kernels::SoftmaxParams& p) override {
    return Enqueue("softmax", [&] { return inner_->Softmax(p); });
  }
  absl::Status ScatterRows(const kernels::ScatterRowsParams& p) override {
    return Enqueue("scatter_rows", [&] { return inner_->ScatterRows(p); });
  }
  absl::Status AttentionInputs(const kernels::AttentionInputsParams& p) override {
    return Enqueue("attention_inputs", [&] { return inner_->AttentionInputs(p); });
  }
  uint64_t filled_bytes() const { return filled_bytes_; }
  // Timing experiments only: the ops named here (as the timeline names
  // them: conv1d, attention_inputs, ...) are dropped, not enqueued, so a step
  // without them shows what fusing them away could save at most. Results
  // are then wrong.
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
  // Every enqueueing call: counted, dropped if skipped, else issued and
  // (in a timeline) marked.
  template <typename Call>
  absl::Status Enqueue(const std::string& name, Call&& call) {
    ++ops_;
    if (skipped_.count(name) != 0) return absl::OkStatus();
    return Mark(name, call());
  }

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
