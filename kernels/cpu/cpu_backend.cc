#include "kernels/cpu/cpu_backend.h"

#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/chunked_delta_rule.h"
#include "kernels/cpu/conv1d.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/embed.h"
#include "kernels/cpu/gated_delta_rule.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/validate.h"
#include "telemetry/status_macros.h"

namespace specserve::kernels::cpu {
namespace {
constexpr size_t kAlignment = 64;
}  // namespace

CpuBackend::CpuBackend(const CpuBackendOptions& options)
    : can_record_(options.recording),
      chunked_prefill_(options.chunked_prefill),
      kv_cache_dtype_(options.kv_cache_dtype),
      recurrent_state_dtype_(options.recurrent_state_dtype) {
  CHECK(recurrent_state_dtype_ == DType::kF32 ||
        recurrent_state_dtype_ == DType::kBF16)
      << "cpu: recurrent_state_dtype is fp32 or bf16";
  int n = options.num_threads;
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  if (n <= 0) n = 1;
  pool_ = std::make_unique<ThreadPool>(n);
}

CpuBackend::~CpuBackend() = default;

absl::StatusOr<Buffer> CpuBackend::Allocate(size_t bytes) {
  SS_RETURN_IF_ERROR(recording_.Refuse("Allocate"));
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
  SS_RETURN_IF_ERROR(recording_.Refuse("CopyToDevice"));
  if (bytes) std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  SS_RETURN_IF_ERROR(recording_.Refuse("CopyToHost"));
  if (bytes) std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyOnDevice(void* dst, const void* src,
                                      size_t bytes) {
  if (recording_.active()) {
    return Record(
        [this, dst, src, bytes] { return CopyOnDevice(dst, src, bytes); });
  }
  if (bytes && dst != src) std::memmove(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::Zero(void* dst, size_t bytes) {
  if (recording_.active()) {
    return Record([this, dst, bytes] { return Zero(dst, bytes); });
  }
  if (bytes) std::memset(dst, 0, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::Synchronize() {
  return recording_.Refuse("Synchronize");
}

// ---- Recording.

namespace {

class CpuRecording : public Backend::Recording {
 public:
  explicit CpuRecording(std::vector<std::function<absl::Status()>> ops)
      : ops_(std::move(ops)) {}
  const std::vector<std::function<absl::Status()>>& ops() const { return ops_; }

 private:
  std::vector<std::function<absl::Status()>> ops_;
};

}  // namespace

absl::Status CpuBackend::Record(std::function<absl::Status()> op) {
  recorded_.push_back(std::move(op));
  return absl::OkStatus();
}

absl::Status CpuBackend::BeginRecording() {
  if (!can_record_) return Backend::BeginRecording();  // UNIMPLEMENTED
  SS_RETURN_IF_ERROR(recording_.Begin());
  recorded_.clear();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Backend::Recording>> CpuBackend::EndRecording() {
  std::vector<std::function<absl::Status()>> ops = std::exchange(recorded_, {});
  SS_RETURN_IF_ERROR(recording_.End());
  return std::unique_ptr<Recording>(new CpuRecording(std::move(ops)));
}

absl::Status CpuBackend::Replay(const Recording& recording) {
  SS_RETURN_IF_ERROR(recording_.Refuse("Replay"));
  const auto* r = dynamic_cast<const CpuRecording*>(&recording);
  if (r == nullptr) {
    return absl::InvalidArgumentError(
        "cpu backend: not a recording of a CPU backend");
  }
  for (const auto& op : r->ops()) SS_RETURN_IF_ERROR(op());
  return absl::OkStatus();
}

absl::StatusOr<Weight> CpuBackend::UploadWeight(DType dtype, const void* host,
                                                int64_t rows, int64_t cols) {
  SS_RETURN_IF_ERROR(recording_.Refuse("UploadWeight"));
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

namespace {

// The CPU kernels read row-major weights only; a weight in another layout
// was made by another backend.
absl::Status RowMajorOnly(WeightLayout layout, const char* op) {
  if (layout == WeightLayout::kRowMajor) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      op, ": the CPU backend reads row-major weights; this one is in ",
      WeightLayoutName(layout), " (a weight of another backend)"));
}

}  // namespace

absl::Status CpuBackend::Embed(const EmbedParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  SS_RETURN_IF_ERROR(RowMajorOnly(p.table_layout, "embed"));
  if (recording_.active()) return Record([this, p] { return Embed(p); });
  return cpu::Embed(p);
}

absl::Status CpuBackend::Matmul(const MatmulParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  SS_RETURN_IF_ERROR(RowMajorOnly(p.w_layout, "matmul"));
  if (recording_.active()) return Record([this, p] { return Matmul(p); });
  if (p.norm_weight == nullptr && !p.swiglu) {
    cpu::Matmul(p, pool_.get());
    return absl::OkStatus();
  }
  // A fused norm or SwiGLU is, by definition, that op then the plain matmul.
  std::vector<float> x(static_cast<size_t>(p.rows * p.in));
  if (p.swiglu) {
    cpu::Swiglu(FusedSwigluOf(p, x.data()));
  } else {
    cpu::RmsNorm(FusedNormOf(p, x.data()));
  }
  MatmulParams plain = p;
  plain.x = x.data();
  plain.x_stride = p.in;
  plain.norm_weight = nullptr;
  plain.swiglu = false;
  cpu::Matmul(plain, pool_.get());
  return absl::OkStatus();
}

absl::Status CpuBackend::RmsNorm(const RmsNormParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  if (recording_.active()) return Record([this, p] { return RmsNorm(p); });
  cpu::RmsNorm(p);
  return absl::OkStatus();
}

absl::Status CpuBackend::GatedRmsNorm(const GatedRmsNormParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  if (recording_.active()) return Record([this, p] { return GatedRmsNorm(p); });
  cpu::GatedRmsNorm(p);
  return absl::OkStatus();
}

// Session batches (positions / states arrays) run as one one-row call per
// row on that row's session: the oracle's definition of the batched ops.

absl::Status CpuBackend::Rope(const RopeParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  if (recording_.active()) return Record([this, p] { return Rope(p); });
  if (p.positions == nullptr) {
    cpu::Rope(p);
    return absl::OkStatus();
  }
  for (int64_t t = 0; t < p.rows; ++t) {
    SS_KERNEL_CHECK(p.positions[t] >= 0, "rope: negative position");
    RopeParams one = p;
    one.rows = 1;
    one.x = p.x + t * p.row_stride;
    one.first_position = p.positions[t];
    one.positions = nullptr;
    cpu::Rope(one);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Attention(const AttentionParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  if (recording_.active()) return Record([this, p] { return Attention(p); });
  if (p.positions == nullptr) {
    cpu::Attention(p, pool_.get());
    return absl::OkStatus();
  }
  for (int64_t t = 0; t < p.rows; ++t) {
    SS_KERNEL_CHECK(p.positions[t] >= 0 && p.positions[t] <= p.max_position,
                    "attention: a batch position outside [0, max_position]");
    AttentionParams one = p;
    one.rows = 1;
    one.q = p.q + t * p.q_row_stride;
    if (p.gate != nullptr) one.gate = p.gate + t * p.gate_row_stride;
    one.out = p.out + t * p.out_row_stride;
    one.k_cache = p.k_caches[t];
    one.v_cache = p.v_caches[t];
    one.first_position = p.positions[t];
    one.capacity = p.positions[t] + 1;
    one.positions = nullptr;
    one.k_caches = one.v_caches = nullptr;
    cpu::Attention(one, pool_.get());
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Conv1d(const Conv1dParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  if (recording_.active()) return Record([this, p] { return Conv1d(p); });
  if (p.states == nullptr) {
    cpu::Conv1d(p);
    return absl::OkStatus();
  }
  for (int64_t t = 0; t < p.rows; ++t) {
    Conv1dParams one = p;
    one.rows = 1;
    one.x = p.x + t * p.x_stride;
    one.y = p.y + t * p.y_stride;
    one.state_in = one.state_out = p.states[t];
    one.states = nullptr;
    cpu::Conv1d(one);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::GatedDeltaRule(const GatedDeltaRuleParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  if (recording_.active())
    return Record([this, p] { return GatedDeltaRule(p); });
  if (p.states == nullptr) {
    cpu::GatedDeltaRule(p, pool_.get());
    return absl::OkStatus();
  }
  for (int64_t t = 0; t < p.rows; ++t) {
    GatedDeltaRuleParams one = p;
    one.rows = 1;
    one.q = p.q + t * p.qkv_stride;
    one.k = p.k + t * p.qkv_stride;
    one.v = p.v + t * p.qkv_stride;
    one.a = p.a + t * p.ab_stride;
    one.b = p.b + t * p.ab_stride;
    one.out = p.out + t * p.out_stride;
    one.state_in = one.state_out = p.states[t];
    one.states = nullptr;
    cpu::GatedDeltaRule(one, pool_.get());
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::PrefillGatedDeltaRule(const GatedDeltaRuleParams& p) {
  if (!chunked_prefill_ || p.states != nullptr || p.state_out_stride != 0) {
    return GatedDeltaRule(p);
  }
  SS_RETURN_IF_ERROR(Validate(p));
  SS_KERNEL_CHECK(p.position >= 0,
                  "prefill gated_delta_rule: negative position");
  if (recording_.active()) {
    return Record([this, p] { return PrefillGatedDeltaRule(p); });
  }
  cpu::ChunkedGatedDeltaRule(p, pool_.get());
  return absl::OkStatus();
}

absl::Status CpuBackend::ScatterRows(const ScatterRowsParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  if (recording_.active()) return Record([this, p] { return ScatterRows(p); });
  const size_t elem = DTypeSize(p.dst_dtype);
  for (int64_t t = 0; t < p.rows; ++t) {
    char* row;
    if (p.dst != nullptr) {
      SS_KERNEL_CHECK(p.dst_rows[t] >= 0, "scatter_rows: negative row");
      row = static_cast<char*>(p.dst[t]) +
            p.dst_rows[t] * p.dst_row_stride * elem;
    } else {
      row = static_cast<char*>(p.dst_base) +
            (p.dst_first_row + t) * p.dst_row_stride * elem;
    }
    const float* src = p.src + t * p.src_stride;
    if (p.dst_dtype == DType::kBF16) {
      uint16_t* out = reinterpret_cast<uint16_t*>(row);
      for (int64_t i = 0; i < p.cols; ++i) out[i] = cpu::FloatToBf16(src[i]);
    } else {
      std::memmove(row, src, p.cols * sizeof(float));
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Swiglu(const SwigluParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  if (recording_.active()) return Record([this, p] { return Swiglu(p); });
  cpu::Swiglu(p);
  return absl::OkStatus();
}

absl::Status CpuBackend::Argmax(const ArgmaxParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  if (recording_.active()) return Record([this, p] { return Argmax(p); });
  cpu::Argmax(p);
  return absl::OkStatus();
}

absl::Status CpuBackend::LogSumExp(const LogSumExpParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  if (recording_.active()) return Record([this, p] { return LogSumExp(p); });
  cpu::LogSumExp(p);
  return absl::OkStatus();
}

absl::Status CpuBackend::Softmax(const SoftmaxParams& p) {
  SS_RETURN_IF_ERROR(Validate(p));
  if (recording_.active()) return Record([this, p] { return Softmax(p); });
  cpu::Softmax(p);
  return absl::OkStatus();
}

}  // namespace specserve::kernels::cpu
