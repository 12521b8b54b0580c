#include "kernels/backend.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/sampling/logit_adjust.h"

namespace specserve::kernels {

absl::StatusOr<Weight> Backend::UploadStackedWeight(
    DType dtype, const std::vector<WeightPart>& parts, int64_t cols) {
  int64_t rows = 0;
  for (const WeightPart& part : parts) {
    if (part.host == nullptr || part.rows < 1) {
      return absl::InvalidArgumentError("stacked weight: empty part");
    }
    rows += part.rows;
  }
  if (rows < 1 || cols < 1)
    return absl::InvalidArgumentError("stacked weight: empty");
  Weight w;
  w.dtype = dtype;
  w.rows = rows;
  w.cols = cols;
  absl::StatusOr<Buffer> storage = Allocate(w.bytes());
  if (!storage.ok()) return storage.status();
  w.storage = std::move(*storage);
  w.data = w.storage.data();
  size_t offset = 0;
  for (const WeightPart& part : parts) {
    const size_t bytes =
        static_cast<size_t>(part.rows * cols) * DTypeSize(dtype);
    absl::Status s = CopyToDevice(static_cast<char*>(w.storage.data()) + offset,
                                  part.host, bytes);
    if (!s.ok()) return s;
    offset += bytes;
  }
  return w;
}

absl::Status Backend::AttentionInputs(const AttentionInputsParams& p) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  for (const RmsNormParams* n : {&p.q_norm, &p.k_norm}) {
    if (absl::Status s = RmsNorm(*n); !s.ok()) return s;
  }
  for (const RopeParams* r : {&p.q_rope, &p.k_rope}) {
    if (absl::Status s = Rope(*r); !s.ok()) return s;
  }
  for (const ScatterRowsParams* c : {&p.k_scatter, &p.v_scatter}) {
    if (absl::Status s = ScatterRows(*c); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Backend::GatedDeltaRuleNormed(const GatedDeltaRuleNormParams& p) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (p.conv.rows > 0) {
    if (absl::Status s = Conv1d(p.conv); !s.ok()) return s;
  }
  if (absl::Status s = GatedDeltaRule(p.rule); !s.ok()) return s;
  return GatedRmsNorm(p.norm);
}

absl::Status Backend::SampleRows(const SampleRowsParams& p) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  std::vector<float> row(p.cols);
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t i = p.row_index != nullptr ? p.row_index[r] : r;
    if (absl::Status s = CopyToHost(row.data(), p.x + i * p.x_stride,
                                    p.cols * sizeof(float));
        !s.ok()) {
      return s;
    }
    // ChooseToken: the filters and draw, masked (-inf) tokens excluded.
    absl::StatusOr<int32_t> token =
        sampling::ChooseToken(row, p.config[r], p.uniform[r]);
    if (!token.ok()) return token.status();
    p.token[r] = *token;
  }
  return absl::OkStatus();
}

absl::Status Backend::MaskTokens(const TokenMaskParams& p) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  const int64_t words = TokenMaskWords(p.cols);
  std::vector<float> row(p.cols);
  for (int64_t r = 0; r < p.rows; ++r) {
    float* x = p.x + p.row_index[r] * p.x_stride;
    const size_t bytes = p.cols * sizeof(float);
    if (absl::Status s = CopyToHost(row.data(), x, bytes); !s.ok()) return s;
    const int32_t best =
        MaskRowAndArgmax(row.data(), p.cols, p.allowed + r * words);
    if (absl::Status s = CopyToDevice(x, row.data(), bytes); !s.ok()) return s;
    if (absl::Status s =
            CopyToDevice(p.argmax + p.row_index[r], &best, sizeof(best));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Backend::BeginRecording() {
  return absl::UnimplementedError(
      absl::StrCat(name(), " backend cannot record ops"));
}

absl::StatusOr<std::unique_ptr<Backend::Recording>> Backend::EndRecording() {
  return absl::UnimplementedError(
      absl::StrCat(name(), " backend cannot record ops"));
}

absl::Status Backend::Replay(const Recording& /*recording*/) {
  return absl::UnimplementedError(
      absl::StrCat(name(), " backend cannot record ops"));
}

}  // namespace specserve::kernels
