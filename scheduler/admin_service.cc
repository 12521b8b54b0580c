#include "scheduler/admin_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/load_model.h"
#include "telemetry/grpc_reactors.h"
#include "telemetry/server_lifecycle.h"

namespace specserve::scheduler {

using telemetry::ToGrpc;

constexpr char kVersion[] = "0.1.0";

grpc::Status AdminService::GetServerInfo(
    grpc::ServerContext* ctx, const specserve::v1::GetServerInfoRequest*,
    specserve::v1::ServerInfo* response) {
  if (absl::StatusOr<Caller> caller = ctx_->Authenticate(*ctx); !caller.ok()) {
    return ToGrpc(caller.status());
  }
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
    grpc::ServerContext* ctx, const specserve::v1::GetModelInfoRequest*,
    specserve::v1::ModelInfo* response) {
  if (absl::StatusOr<Caller> caller = ctx_->Authenticate(*ctx); !caller.ok()) {
    return ToGrpc(caller.status());
  }
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
  absl::StatusOr<Caller> caller = ctx_->Authenticate(*ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  if (absl::Status s = RequireAdmin(*caller, "Admin.LoadModel"); !s.ok()) {
    return ToGrpc(s);
  }
  // Without a client deadline: long enough for a large model to load.
  absl::Time deadline = absl::FromChrono(ctx->deadline());
  if (deadline > absl::Now() + absl::Minutes(30))
    deadline = absl::Now() + absl::Minutes(10);
  return LoadModelEverywhere(ctx_, request->model_dir(), deadline,
                             response->mutable_model());
}

grpc::Status AdminService::Abort(grpc::ServerContext* ctx,
                                 const specserve::v1::AbortRequest* request,
                                 specserve::v1::AbortResponse* response) {
  absl::StatusOr<Caller> caller = ctx_->Authenticate(*ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  int n = 0;
  switch (request->target_case()) {
    case specserve::v1::AbortRequest::kRequestId:
      // Another tenant's request id reads as one that is not running: its
      // ids are its own (scheduler/request_registry.h).
      n = ctx_->requests->AbortRequest(caller->tenant, request->request_id());
      if (n == 0) {
        return grpc::Status(
            grpc::StatusCode::NOT_FOUND,
            absl::StrCat("request ", request->request_id(), " is not running"));
      }
      break;
    case specserve::v1::AbortRequest::kSessionId: {
      // NOT_FOUND, with the message of an unknown id, unless the session is
      // the caller's.
      auto session = ctx_->sessions->Get(request->session_id(), caller->tenant);
      if (!session.ok()) return ToGrpc(session.status());
      n = ctx_->requests->AbortSession(caller->tenant, request->session_id());
      break;
    }
    case specserve::v1::AbortRequest::kAll:
      if (!request->all()) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "all must be true to abort every request");
      }
      if (absl::Status s =
              RequireAdmin(*caller, "Admin.Abort of every request");
          !s.ok()) {
        return ToGrpc(s);
      }
      n = ctx_->requests->AbortAll();
      break;
    default:
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "give a request_id, a session_id, or all");
  }
  response->set_aborted(n);
  return grpc::Status::OK;
}

grpc::Status AdminService::Drain(grpc::ServerContext* ctx,
                                 const specserve::v1::DrainRequest*,
                                 specserve::v1::DrainResponse* response) {
  absl::StatusOr<Caller> caller = ctx_->Authenticate(*ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  if (absl::Status s = RequireAdmin(*caller, "Admin.Drain"); !s.ok()) {
    return ToGrpc(s);
  }
  response->set_in_flight(telemetry::InFlightCount());
  telemetry::RequestDrain();
  return grpc::Status::OK;
}

}  // namespace specserve::scheduler
