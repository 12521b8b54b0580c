#include "kernels/backend.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/sampling/philox.h"

namespace specserve::kernels {

absl::StatusOr<Weight> Backend::UploadStackedWeight(DType dtype,
                                                    const std::vector<WeightPart>& parts,
                                                    int64_t cols) {
  int64_t rows = 0;
  for (const WeightPart& part : parts) {
    if (part.host == nullptr || part.rows < 1) {
      return absl::InvalidArgumentError("stacked weight: empty part");
    }
    rows += part.rows;
  }
  if (rows < 1 || cols < 1) return absl::InvalidArgumentError("stacked weight: empty");
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
    const size_t bytes = static_cast<size_t>(part.rows * cols) * DTypeSize(dtype);
    absl::Status s =
        CopyToDevice(static_cast<char*>(w.storage.data()) + offset, part.host, bytes);
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
  std::vector<float> probs;
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t i = p.row_index != nullptr ? p.row_index[r] : r;
    if (absl::Status s = CopyToHost(row.data(), p.x + i * p.x_stride, p.cols * sizeof(float));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = sampling::FilteredProbs(row.data(), static_cast<int>(p.cols),
                                                 p.config[r], &probs);
        !s.ok()) {
      return s;
    }
    if (p.probs != nullptr) {
      if (absl::Status s = CopyToDevice(p.probs + r * p.probs_stride, probs.data(),
                                        p.cols * sizeof(float));
          !s.ok()) {
        return s;
      }
    }
    if (p.token != nullptr) p.token[r] = sampling::SampleIndex(probs, p.uniform[r]);
  }
  return absl::OkStatus();
}

absl::Status Backend::DrawFromProbs(const DrawFromProbsParams& p) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  std::vector<float> probs(p.cols);
  if (absl::Status s = CopyToHost(probs.data(), p.p, p.cols * sizeof(float)); !s.ok()) return s;
  if (p.minus != nullptr) {
    std::vector<float> minus(p.cols);
    if (absl::Status s = CopyToHost(minus.data(), p.minus, p.cols * sizeof(float)); !s.ok()) {
      return s;
    }
    *p.token = sampling::SampleResidual(probs, minus, p.uniform);
    return absl::OkStatus();
  }
  *p.token = sampling::SampleIndex(probs, p.uniform);
  return absl::OkStatus();
}

absl::Status Backend::AcceptRound(const AcceptRoundParams& p) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  int n = 0;
  for (; n < p.k; ++n) {
    float pv = 0.0f, qv = 0.0f;
    if (absl::Status s = CopyToHost(&pv, p.p + n * p.p_stride + p.drafts[n], sizeof(float));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CopyToHost(&qv, p.q + n * p.q_stride + p.drafts[n], sizeof(float));
        !s.ok()) {
      return s;
    }
    const float u = sampling::Uniform(p.seed, sampling::RandomStream::kAccept, p.uctr + n);
    if (!(u * qv < pv)) break;
  }
  DrawFromProbsParams d;
  d.cols = p.cols;
  d.p = p.p + n * p.p_stride;
  d.minus = n < p.k ? p.q + n * p.q_stride : nullptr;
  d.uniform = sampling::Uniform(p.seed, sampling::RandomStream::kSample, p.sctr);
  d.token = p.bonus;
  if (absl::Status s = DrawFromProbs(d); !s.ok()) return s;
  *p.accepted = n;
  return absl::OkStatus();
}

absl::Status Backend::BeginRecording() {
  return absl::UnimplementedError(absl::StrCat(name(), " backend cannot record ops"));
}

absl::StatusOr<std::unique_ptr<Backend::Recording>> Backend::EndRecording() {
  return absl::UnimplementedError(absl::StrCat(name(), " backend cannot record ops"));
}

absl::Status Backend::Replay(const Recording& /*recording*/) {
  return absl::UnimplementedError(absl::StrCat(name(), " backend cannot record ops"));
}

}  // namespace specserve::kernels
