// Measures what a decode step and a verify pass cost on this worker, for the
// scheduler's spec gate (docs/DESIGN.md §4): decode at batch sizes 1..N and
// verify at 1..C columns, on scratch sessions, at start-up.
#ifndef SPECSERVE_WORKER_STEP_COSTS_H_
#define SPECSERVE_WORKER_STEP_COSTS_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/worker.pb.h"
#include "worker/model/model.h"

namespace specserve::worker {

// Minimum over `reps` timings of each configuration.
absl::StatusOr<specserve::worker::v1::StepCosts> MeasureStepCosts(
    model::Model* model, int max_batch, int max_columns, int reps);

// Parses "decode=S1,S2,...;verify=S1,S2,..." (seconds).
absl::StatusOr<specserve::worker::v1::StepCosts> ParseStepCosts(
    const std::string& spec);

}  // namespace specserve::worker

#endif  // SPECSERVE_WORKER_STEP_COSTS_H_
