// Serializes a worker's use of its one Model (forward calls share the model's
// workspace and backend) and batches concurrent plain-decode steps of
// different sessions into one DecodeBatch pass.
//
// Batching is by combining: a caller of Decode() queues its step; whoever
// finds no batch running becomes the leader, takes the model, and runs every
// queued step (up to kMaxBatch) as one pass, then hands each caller its
// result. DecodeBatch is bit-identical to Decode per session (row-invariant
// kernels), so a session's output never depends on who it was batched with.
#ifndef SPECSERVE_WORKER_SPEC_MODEL_EXECUTOR_H_
#define SPECSERVE_WORKER_SPEC_MODEL_EXECUTOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/model/model.h"
#include "worker/spec/live_step_costs.h"

namespace specserve::spec {

class ModelExecutor {
 public:
  static constexpr int kMaxBatch = model::Model::kMaxRows;

  explicit ModelExecutor(model::Model* model) : model_(model) {}

  model::Model* model() const { return model_; }

  // Where decode passes and speculative rounds report what they cost (null:
  // nowhere). Set before the first forward call; not owned.
  void set_live_costs(LiveStepCosts* costs) { live_costs_ = costs; }
  LiveStepCosts* live_costs() const { return live_costs_; }

  // Runs `fn` with exclusive use of the model.
  absl::Status Exclusive(const std::function<absl::Status()>& fn);

  // One plain decode step of `state`, batched with concurrent callers. With
  // out->draw set, the step's token is also drawn on the backend, in one
  // SampleRows call for the whole batch (out->drawn).
  absl::Status Decode(model::ModelState* state, int32_t token,
                      model::ForwardResult* out);

  struct Stats {
    uint64_t batches = 0;  // DecodeBatch passes run
    uint64_t steps = 0;    // decode steps they carried
    uint64_t exclusive = 0;
  };
  Stats stats() const;

 private:
  struct Step {
    model::ModelState* state;
    int32_t token;
    model::ForwardResult* out;
    absl::Status status;
    bool done = false;
  };

  // The draws the steps ask for, over rows[i] of the pass just run (whose
  // outputs `pass` holds).
  absl::Status DrawRows(const std::vector<Step*>& steps,
                        const model::ForwardResult& pass,
                        const std::vector<int32_t>& rows)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(model_mu_);

  model::Model* const model_;
  LiveStepCosts* live_costs_ = nullptr;
  // Held for every forward call.
  absl::Mutex model_mu_;

  mutable absl::Mutex queue_mu_;
  std::deque<Step*> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool leader_active_ ABSL_GUARDED_BY(queue_mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(queue_mu_);
};

}  // namespace specserve::spec

#endif  // SPECSERVE_WORKER_SPEC_MODEL_EXECUTOR_H_
