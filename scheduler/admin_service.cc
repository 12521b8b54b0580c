#include "scheduler/admin_service.h"

#include <utility>

#include "telemetry/grpc_reactors.h"
#include "telemetry/server_lifecycle.h"

namespace specserve::scheduler {

using telemetry::FinishUnary;

constexpr char kVersion[] = "0.1.0";

grpc::ServerUnaryReactor* AdminService::GetServerInfo(
    grpc::CallbackServerContext* ctx, const specserve::v1::GetServerInfoRequest*,
    specserve::v1::ServerInfo* response) {
  response->set_version(kVersion);
  response->set_draining(telemetry::DrainRequested());
  for (auto& status : pool_->Snapshot()) {
    if (status.available() && !response->has_model()) {
      *response->mutable_model() = status.model();
    }
    *response->add_workers() = std::move(status);
  }
  return FinishUnary(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* AdminService::GetModelInfo(
    grpc::CallbackServerContext* ctx, const specserve::v1::GetModelInfoRequest*,
    specserve::v1::ModelInfo* response) {
  for (const auto& status : pool_->Snapshot()) {
    if (status.available()) {
      *response = status.model();
      return FinishUnary(ctx, grpc::Status::OK);
    }
  }
  return FinishUnary(ctx, grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                       "no worker is available to report the "
                                       "model; see GetServerInfo for details"));
}

grpc::ServerUnaryReactor* AdminService::LoadModel(
    grpc::CallbackServerContext* ctx, const specserve::v1::LoadModelRequest*,
    specserve::v1::LoadModelResponse*) {
  return FinishUnary(
      ctx, grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "LoadModel: hot model reload is not implemented yet; "
                        "restart the workers with --model DIR"));
}

grpc::ServerUnaryReactor* AdminService::Abort(
    grpc::CallbackServerContext* ctx, const specserve::v1::AbortRequest*,
    specserve::v1::AbortResponse*) {
  return FinishUnary(
      ctx, grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "Abort: requests cannot be aborted yet because "
                        "generation is not implemented in this build"));
}

grpc::ServerUnaryReactor* AdminService::Drain(
    grpc::CallbackServerContext* ctx, const specserve::v1::DrainRequest*,
    specserve::v1::DrainResponse* response) {
  response->set_in_flight(telemetry::InFlightCount());
  telemetry::RequestDrain();
  return FinishUnary(ctx, grpc::Status::OK);
}

}  // namespace specserve::scheduler
