#include "kernels/cpu/cpu_backend.h"

#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/conv1d.h"
#include "kernels/cpu/embed.h"
#include "kernels/cpu/gated_delta_rule.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "telemetry/status_macros.h"

namespace specserve::kernels::cpu {
namespace {
constexpr size_t kAlignment = 64;
}  // namespace

CpuBackend::CpuBackend(const CpuBackendOptions& options) {
  int n = options.num_threads;
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  if (n <= 0) n = 1;
  pool_ = std::make_unique<ThreadPool>(n);
}

CpuBackend::~CpuBackend() = default;

absl::StatusOr<Buffer> CpuBackend::Allocate(size_t bytes) {
  const size_t rounded = ((bytes + kAlignment - 1) / kAlignment) * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cpu backend: cannot allocate ", bytes, " bytes"));
  }
  std::memset(p, 0, rounded);
  return Buffer(this, p, bytes);
}

void CpuBackend::Free(void* data) { std::free(data); }

absl::Status CpuBackend::CopyToDevice(void* dst, const void* src,
                                      size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyOnDevice(void* dst, const void* src,
                                      size_t bytes) {
  if (bytes && dst != src) std::memmove(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::Zero(void* dst, size_t bytes) {
  if (bytes) std::memset(dst, 0, bytes);
  return absl::OkStatus();
}

absl::StatusOr<Weight> CpuBackend::UploadWeight(DType dtype, const void* host,
                                                int64_t rows, int64_t cols) {
  if (host == nullptr || rows < 1 || cols < 1) {
    return absl::InvalidArgumentError("cpu backend: empty weight");
  }
  Weight w;
  w.dtype = dtype;
  w.rows = rows;
  w.cols = cols;
  w.data = host;  // read in place
  return w;
}

absl::Status CpuBackend::Embed(const EmbedParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  return cpu::Embed(p);
}

absl::Status CpuBackend::Matmul(const MatmulParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  cpu::Matmul(p, pool_.get());
  return absl::OkStatus();
}

absl::Status CpuBackend::RmsNorm(const RmsNormParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  cpu::RmsNorm(p);
  return absl::OkStatus();
}

absl::Status CpuBackend::GatedRmsNorm(const GatedRmsNormParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  cpu::GatedRmsNorm(p);
  return absl::OkStatus();
}

absl::Status CpuBackend::Rope(const RopeParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  cpu::Rope(p);
  return absl::OkStatus();
}

absl::Status CpuBackend::Attention(const AttentionParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  cpu::Attention(p, pool_.get());
  return absl::OkStatus();
}

absl::Status CpuBackend::Conv1d(const Conv1dParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  cpu::Conv1d(p);
  return absl::OkStatus();
}

absl::Status CpuBackend::GatedDeltaRule(const GatedDeltaRuleParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  cpu::GatedDeltaRule(p, pool_.get());
  return absl::OkStatus();
}

absl::Status CpuBackend::Swiglu(const SwigluParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  cpu::Swiglu(p);
  return absl::OkStatus();
}

absl::Status CpuBackend::Argmax(const ArgmaxParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  cpu::Argmax(p);
  return absl::OkStatus();
}

absl::Status CpuBackend::LogSumExp(const LogSumExpParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  cpu::LogSumExp(p);
  return absl::OkStatus();
}

absl::Status CpuBackend::Softmax(const SoftmaxParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  cpu::Softmax(p);
  return absl::OkStatus();
}

}  // namespace specserve::kernels::cpu
