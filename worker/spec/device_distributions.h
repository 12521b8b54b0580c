// A sampled speculative round's distributions kept in backend memory, for
// the accept step (spec_accept.h RoundDistributions): draft i's filtered
// distribution q_i in the model's sampling scratch row i (the draft step's
// Model::SampleRows writes it as it draws), and a verify column's p filtered
// into row k when the accept step first asks for that column. Only single
// probabilities and tokens cross to the host; on the CPU backend this is the
// host filters on host memory, the same numbers as the vector form.
#ifndef SPECSERVE_WORKER_SPEC_DEVICE_DISTRIBUTIONS_H_
#define SPECSERVE_WORKER_SPEC_DEVICE_DISTRIBUTIONS_H_

#include "kernels/sampling/sampling.h"
#include "worker/model/model.h"
#include "worker/spec/spec_accept.h"

namespace specserve::spec {

class DeviceDistributions : public RoundDistributions {
 public:
  // k drafts; the model's latest pass is the round's verify (its logits
  // rows are the columns) and scratch rows 0..k are reserved.
  DeviceDistributions(model::Model* model, const sampling::SamplingConfig& config, int k)
      : model_(model), config_(config), k_(k) {}

  absl::StatusOr<float> Target(int column, int token) override;
  absl::StatusOr<float> Draft(int i, int token) override;
  absl::StatusOr<int> DrawResidual(int i, float u) override;
  absl::StatusOr<int> DrawTarget(int column, float u) override;

 private:
  // Verify column `column`'s filtered distribution into scratch row k.
  absl::Status Column(int column);

  model::Model* const model_;
  const sampling::SamplingConfig config_;
  const int k_;
  int column_ = -1;  // the column in row k
};

}  // namespace specserve::spec

#endif  // SPECSERVE_WORKER_SPEC_DEVICE_DISTRIBUTIONS_H_
