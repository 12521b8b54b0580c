#include "scheduler/load_model.h"

#include <filesystem>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace specserve::scheduler {
namespace {

using specserve::worker::v1::LoadModelRequest;
using specserve::worker::v1::LoadModelResponse;

// Worker.LoadModel on every worker; the first failure, with the worker's
// address in its message.
grpc::Status CallWorkers(SchedulerContext* ctx, const std::string& dir,
                         bool validate_only, absl::Time deadline) {
  for (int i = 0; i < ctx->workers->size(); ++i) {
    grpc::ClientContext call;
    call.set_deadline(absl::ToChronoTime(deadline));
    LoadModelRequest request;
    request.set_model_dir(dir);
    request.set_validate_only(validate_only);
    LoadModelResponse response;
    const grpc::Status s =
        ctx->workers->stub(i)->LoadModel(&call, request, &response);
    if (!s.ok()) {
      return grpc::Status(s.error_code(),
                          absl::StrCat("worker ", ctx->workers->address(i),
                                       ": ", s.error_message()));
    }
  }
  return grpc::Status::OK;
}

// Every worker answers again, restarted (a new instance: a reload of the
// same directory changes no path), on `dir`.
bool AllRestartedOn(const SchedulerContext* ctx, const std::string& dir,
                    const std::vector<uint64_t>& old_instances) {
  for (int i = 0; i < ctx->workers->size(); ++i) {
    if (!ctx->workers->Available(i)) return false;
    const auto info = ctx->workers->Info(i);
    if (info.instance() == old_instances[i] || info.model().path() != dir)
      return false;
  }
  return true;
}

}  // namespace

std::string ModelDirName(const std::string& model_dir) {
  std::string dir = model_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const size_t slash = dir.rfind('/');
  return slash == std::string::npos || dir.size() == 1 ? dir
                                                       : dir.substr(slash + 1);
}

absl::StatusOr<std::shared_ptr<const tokenizer::Tokenizer>> LoadModelTokenizer(
    const std::string& model_dir) {
  const std::string path = model_dir + "/tokenizer.json";
  if (!std::filesystem::exists(path)) return nullptr;
  auto loaded = tokenizer::Tokenizer::Load(path);
  if (!loaded.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load ", path, ": ", loaded.status().message()));
  }
  return std::shared_ptr<const tokenizer::Tokenizer>(std::move(*loaded));
}

grpc::Status LoadModelEverywhere(SchedulerContext* ctx,
                                 const std::string& model_dir,
                                 absl::Time deadline,
                                 specserve::v1::ModelInfo* model) {
  if (model_dir.empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "LoadModel: model_dir is empty");
  }
  if (const int running = ctx->requests->size(); running > 0) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat(running,
                     " request(s) are running; LoadModel needs none "
                     "(wait for them, or Admin.Drain)"));
  }
  for (int i = 0; i < ctx->workers->size(); ++i) {
    if (!ctx->workers->Available(i)) {
      return grpc::Status(
          grpc::StatusCode::UNAVAILABLE,
          absl::StrCat("worker ", ctx->workers->address(i),
                       " is unavailable; LoadModel switches every worker"));
    }
  }
  auto tokenizer = LoadModelTokenizer(model_dir);
  if (!tokenizer.ok()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        std::string(tokenizer.status().message()));
  }
  if (grpc::Status s =
          CallWorkers(ctx, model_dir, /*validate_only=*/true, deadline);
      !s.ok()) {
    return s;
  }
  std::vector<uint64_t> old_instances;
  for (int i = 0; i < ctx->workers->size(); ++i) {
    old_instances.push_back(ctx->workers->Info(i).instance());
  }
  if (grpc::Status s =
          CallWorkers(ctx, model_dir, /*validate_only=*/false, deadline);
      !s.ok()) {
    return s;
  }
  LOG(INFO) << "LoadModel: workers restarting on " << model_dir;
  // The workers drain, restart and report again (the pool's health polling).
  while (!AllRestartedOn(ctx, model_dir, old_instances)) {
    if (absl::Now() > deadline) {
      return grpc::Status(
          grpc::StatusCode::UNAVAILABLE,
          absl::StrCat("workers did not come back on ", model_dir,
                       " before the deadline; see GetServerInfo"));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  ctx->SetTokenizer(std::move(*tokenizer));
  const int closed = ctx->sessions->CloseAll();
  LOG(INFO) << "LoadModel: now serving " << model_dir << "; closed " << closed
            << " session(s)";
  *model = ctx->workers->Info(0).model();
  return grpc::Status::OK;
}

}  // namespace specserve::scheduler
