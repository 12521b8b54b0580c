// A Backend that passes every call to another backend it does not own: the
// base for wrappers that change or observe a few calls (fault injection in
// tests, timelines in benchmarks) and leave the rest as they are. Buffers
// and weights come from the inner backend and are freed by it.
#ifndef SPECSERVE_KERNELS_FORWARDING_BACKEND_H_
#define SPECSERVE_KERNELS_FORWARDING_BACKEND_H_

#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace specserve::kernels {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend* inner) : inner_(inner) {}

  std::string name() const override { return inner_->name(); }
  absl::StatusOr<uint64_t> FreeDeviceBytes() const override {
    return inner_->FreeDeviceBytes();
  }
  absl::StatusOr<Buffer> Allocate(size_t bytes) override {
    return inner_->Allocate(bytes);
  }
  size_t SharingPageBytes() const override {
    return inner_->SharingPageBytes();
  }
  absl::StatusOr<Buffer> AllocateShareable(
      size_t bytes, absl::Span<const size_t> share_points) override {
    return inner_->AllocateShareable(bytes, share_points);
  }
  absl::StatusOr<Buffer> AllocateSharing(size_t bytes, const Buffer& src,
                                         size_t share,
                                         size_t* shared) override {
    return inner_->AllocateSharing(bytes, src, share, shared);
  }
  absl::Status Unshare(const Buffer& buffer, size_t from) override {
    return inner_->Unshare(buffer, from);
  }
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override {
    return inner_->CopyToDevice(dst, src, bytes);
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    return inner_->CopyToHost(dst, src, bytes);
  }
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    return inner_->CopyOnDevice(dst, src, bytes);
  }
  absl::Status Zero(void* dst, size_t bytes) override {
    return inner_->Zero(dst, bytes);
  }
  absl::StatusOr<Weight> UploadWeight(DType dtype, const void* host,
                                      int64_t rows, int64_t cols) override {
    return inner_->UploadWeight(dtype, host, rows, cols);
  }
  absl::StatusOr<Weight> UploadStackedWeight(
      DType dtype, const std::vector<WeightPart>& parts,
      int64_t cols) override {
    return inner_->UploadStackedWeight(dtype, parts, cols);
  }
  absl::Status Synchronize() override { return inner_->Synchronize(); }

  bool CanRecord() const override { return inner_->CanRecord(); }
  absl::Status BeginRecording() override { return inner_->BeginRecording(); }
  absl::StatusOr<std::unique_ptr<Recording>> EndRecording() override {
    return inner_->EndRecording();
  }
  absl::Status Replay(const Recording& r) override { return inner_->Replay(r); }

  absl::Status Embed(const EmbedParams& p) override { return inner_->Embed(p); }
  absl::Status Matmul(const MatmulParams& p) override {
    return inner_->Matmul(p);
  }
  absl::Status RmsNorm(const RmsNormParams& p) override {
    return inner_->RmsNorm(p);
  }
  absl::Status GatedRmsNorm(const GatedRmsNormParams& p) override {
    return inner_->GatedRmsNorm(p);
  }
  absl::Status Rope(const RopeParams& p) override { return inner_->Rope(p); }
  absl::Status Attention(const AttentionParams& p) override {
    return inner_->Attention(p);
  }
  absl::Status Conv1d(const Conv1dParams& p) override {
    return inner_->Conv1d(p);
  }
  absl::Status GatedDeltaRule(const GatedDeltaRuleParams& p) override {
    return inner_->GatedDeltaRule(p);
  }
  absl::Status GatedDeltaRuleNormed(
      const GatedDeltaRuleNormParams& p) override {
    return inner_->GatedDeltaRuleNormed(p);
  }
  absl::Status Swiglu(const SwigluParams& p) override {
    return inner_->Swiglu(p);
  }
  absl::Status Argmax(const ArgmaxParams& p) override {
    return inner_->Argmax(p);
  }
  absl::Status MaskTokens(const TokenMaskParams& p) override {
    return inner_->MaskTokens(p);
  }
  absl::Status LogSumExp(const LogSumExpParams& p) override {
    return inner_->LogSumExp(p);
  }
  absl::Status Softmax(const SoftmaxParams& p) override {
    return inner_->Softmax(p);
  }
  absl::Status ScatterRows(const ScatterRowsParams& p) override {
    return inner_->ScatterRows(p);
  }
  absl::Status AttentionInputs(const AttentionInputsParams& p) override {
    return inner_->AttentionInputs(p);
  }
  DType KvCacheDType() const override { return inner_->KvCacheDType(); }
  DType RecurrentStateDType() const override {
    return inner_->RecurrentStateDType();
  }
  bool ExactPrefill() const override { return inner_->ExactPrefill(); }
  absl::Status PrefillMatmul(const MatmulParams& p) override {
    return inner_->PrefillMatmul(p);
  }
  absl::Status PrefillAttention(const AttentionParams& p) override {
    return inner_->PrefillAttention(p);
  }
  absl::Status PrefillAttentionSlices(
      absl::Span<const AttentionParams> slices) override {
    return inner_->PrefillAttentionSlices(slices);
  }
  absl::Status PrefillGatedDeltaRule(const GatedDeltaRuleParams& p) override {
    return inner_->PrefillGatedDeltaRule(p);
  }
  absl::Status PrefillGatedDeltaRuleSlices(
      absl::Span<const GatedDeltaRuleParams> slices) override {
    return inner_->PrefillGatedDeltaRuleSlices(slices);
  }
  absl::Status Conv1dSlices(absl::Span<const Conv1dParams> slices) override {
    return inner_->Conv1dSlices(slices);
  }
  absl::Status SampleRows(const SampleRowsParams& p) override {
    return inner_->SampleRows(p);
  }

 protected:
  Backend* inner() const { return inner_; }
  // Never called unless a subclass hands out buffers of its own: every
  // Buffer forwarded belongs to the inner backend.
  void Free(void* /*data*/) override {}

 private:
  Backend* const inner_;
};

}  // namespace specserve::kernels

#endif  // SPECSERVE_KERNELS_FORWARDING_BACKEND_H_
