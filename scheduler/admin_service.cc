#include "scheduler/admin_service.h"

#include <utility>

#include "scheduler/load_model.h"
#include "telemetry/grpc_reactors.h"
#include "telemetry/server_lifecycle.h"

namespace specserve::scheduler {

constexpr char kVersion[] = "0.1.0";

grpc::Status AdminService::GetServerInfo(
    grpc::ServerContext*, const specserve::v1::GetServerInfoRequest*,
    specserve::v1::ServerInfo* response) {
  response->set_version(kVersion);
  response->set_draining(telemetry::DrainRequested());
  for (auto& status : ctx_->workers->Snapshot()) {
    if (status.available() && !response->has_model()) {
      *response->mutable_model() = status.model();
    }
    *response->add_workers() = std::move(status);
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::GetModelInfo(
    grpc::ServerContext*, const specserve::v1::GetModelInfoRequest*,
    specserve::v1::ModelInfo* response) {
  for (const auto& status : ctx_->workers->Snapshot()) {
    if (status.available()) {
      *response = status.model();
      return grpc::Status::OK;
    }
  }
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "no worker is available to report the "
                      "model; see GetServerInfo for details");
}

grpc::Status AdminService::LoadModel(
    grpc::ServerContext* ctx, const specserve::v1::LoadModelRequest* request,
    specserve::v1::LoadModelResponse* response) {
  // Without a client deadline: long enough for a large model to load.
  absl::Time deadline = absl::FromChrono(ctx->deadline());
  if (deadline > absl::Now() + absl::Minutes(30))
    deadline = absl::Now() + absl::Minutes(10);
  return LoadModelEverywhere(ctx_, request->model_dir(), deadline,
                             response->mutable_model());
}

grpc::Status AdminService::Abort(grpc::ServerContext*,
                                 const specserve::v1::AbortRequest* request,
                                 specserve::v1::AbortResponse* response) {
  int n = 0;
  if (request->has_request_id()) {
    n = ctx_->requests->AbortRequest(request->request_id());
  } else if (request->has_session_id()) {
    n = ctx_->requests->AbortSession(request->session_id());
  } else {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "give a request_id or a session_id");
  }
  response->set_aborted(n);
  return grpc::Status::OK;
}

grpc::Status AdminService::Drain(grpc::ServerContext*,
                                 const specserve::v1::DrainRequest*,
                                 specserve::v1::DrainResponse* response) {
  response->set_in_flight(telemetry::InFlightCount());
  telemetry::RequestDrain();
  return grpc::Status::OK;
}

}  // namespace specserve::scheduler
