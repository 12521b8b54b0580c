#include "worker/worker_service.h"

#include <unistd.h>

#include <utility>

#include "telemetry/grpc_reactors.h"
#include "telemetry/server_lifecycle.h"
#include "worker/model_info.h"

namespace specserve::worker {
namespace {

using specserve::worker::v1::BurstEvent;

constexpr char kSessionsNotYet[] =
    "speculative sessions are not implemented in this worker build yet "
    "(issue: speculative sessions in the worker)";

using Finished = telemetry::FinishedWriteReactor<BurstEvent>;

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx,
                                 grpc::Status status) {
  return telemetry::FinishUnary(ctx, std::move(status));
}

grpc::Status Draining() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "worker is draining: no new work accepted");
}

grpc::Status NotYet(const std::string& rpc) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                      rpc + ": " + kSessionsNotYet);
}

}  // namespace

WorkerService::WorkerService(WorkerOptions options,
                             std::unique_ptr<model_files::Checkpoint> checkpoint)
    : options_(std::move(options)),
      checkpoint_(std::move(checkpoint)),
      model_info_(DescribeModel(*checkpoint_)) {}

grpc::ServerUnaryReactor* WorkerService::GetWorkerInfo(
    grpc::CallbackServerContext* ctx,
    const specserve::worker::v1::WorkerInfoRequest*,
    specserve::worker::v1::WorkerInfo* response) {
  response->set_device(options_.device);
  *response->mutable_model() = model_info_;
  response->set_default_capacity(options_.default_capacity);
  response->set_pid(static_cast<uint32_t>(getpid()));
  return Finish(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* WorkerService::Admit(
    grpc::CallbackServerContext* ctx, const specserve::worker::v1::AdmitRequest*,
    specserve::worker::v1::SessionState*) {
  if (telemetry::DrainRequested()) return Finish(ctx, Draining());
  return Finish(ctx, NotYet("Admit"));
}

grpc::ServerWriteReactor<BurstEvent>* WorkerService::Burst(
    grpc::CallbackServerContext*, const specserve::worker::v1::BurstRequest*) {
  if (telemetry::DrainRequested()) return new Finished(Draining());
  return new Finished(NotYet("Burst"));
}

#define SPECSERVE_NOT_YET_SESSION_RPC(Name, Response)                      \
  grpc::ServerUnaryReactor* WorkerService::Name(                           \
      grpc::CallbackServerContext* ctx,                                    \
      const specserve::worker::v1::SessionRef*, Response*) {               \
    return Finish(ctx, NotYet(#Name));                                     \
  }

SPECSERVE_NOT_YET_SESSION_RPC(Flush, specserve::worker::v1::SessionState)
SPECSERVE_NOT_YET_SESSION_RPC(Park, specserve::worker::v1::SessionState)
SPECSERVE_NOT_YET_SESSION_RPC(Resume, specserve::worker::v1::SessionState)
SPECSERVE_NOT_YET_SESSION_RPC(Rewind, specserve::worker::v1::SessionState)
SPECSERVE_NOT_YET_SESSION_RPC(Demote, specserve::worker::v1::SessionState)
SPECSERVE_NOT_YET_SESSION_RPC(Release, specserve::worker::v1::ReleaseResponse)
SPECSERVE_NOT_YET_SESSION_RPC(GetSessionState,
                              specserve::worker::v1::SessionState)

#undef SPECSERVE_NOT_YET_SESSION_RPC

}  // namespace specserve::worker
