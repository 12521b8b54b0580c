// Admin.LoadModel: switch every worker, and the scheduler's tokenizer, to
// another model directory (a path the scheduler and the workers can read).
//
// Order, so that a bad directory changes nothing: the scheduler loads the
// tokenizer (if the directory has one) and every worker checks the
// directory (Worker.LoadModel validate_only); only then do the workers
// restart on it (same port) and the scheduler waits until each reports it.
// The sessions are then closed: their caches are gone and their token
// histories belong to the old model.
#ifndef SPECSERVE_SCHEDULER_LOAD_MODEL_H_
#define SPECSERVE_SCHEDULER_LOAD_MODEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/specserve.pb.h"
#include "scheduler/scheduler_context.h"

namespace specserve::scheduler {

// The tokenizer of a model directory, at start-up and on LoadModel: its
// tokenizer.json, or null when it has none (the API then takes token ids
// only). An error names the file.
absl::StatusOr<std::shared_ptr<const tokenizer::Tokenizer>> LoadModelTokenizer(
    const std::string& model_dir);

// The name a model directory is served under by default: its last path
// component ("models/qwen3/" -> "qwen3"; a symlink keeps its own name).
std::string ModelDirName(const std::string& model_dir);

// INVALID_ARGUMENT (bad directory; nothing changed), FAILED_PRECONDITION
// (requests are running), UNAVAILABLE (a worker is down, or did not come
// back on the new model by `deadline`).
grpc::Status LoadModelEverywhere(SchedulerContext* ctx,
                                 const std::string& model_dir,
                                 absl::Time deadline,
                                 specserve::v1::ModelInfo* model);

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_LOAD_MODEL_H_
