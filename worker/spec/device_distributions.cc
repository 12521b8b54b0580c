#include "worker/spec/device_distributions.h"

#include <cstdint>

#include "telemetry/status_macros.h"

namespace specserve::spec {

absl::Status DeviceDistributions::Column(int column) {
  if (column == column_) return absl::OkStatus();
  const int32_t row = column;
  SS_RETURN_IF_ERROR(model_->SampleRows({row}, {config_}, {}, /*tokens=*/nullptr, k_));
  column_ = column;
  return absl::OkStatus();
}

absl::StatusOr<float> DeviceDistributions::Target(int column, int token) {
  SS_RETURN_IF_ERROR(Column(column));
  return model_->ScratchProb(k_, token);
}

absl::StatusOr<float> DeviceDistributions::Draft(int i, int token) {
  return model_->ScratchProb(i, token);
}

absl::StatusOr<int> DeviceDistributions::DrawResidual(int i, float u) {
  SS_RETURN_IF_ERROR(Column(i));
  return model_->DrawFromScratch(k_, i, u);
}

absl::StatusOr<int> DeviceDistributions::DrawTarget(int column, float u) {
  SS_RETURN_IF_ERROR(Column(column));
  return model_->DrawFromScratch(k_, -1, u);
}

}  // namespace specserve::spec
