// specserve.v1.Admin: server and model info (from the worker pool), abort by
// request or session, drain. LoadModel answers UNIMPLEMENTED (no hot reload).
#ifndef SPECSERVE_SCHEDULER_ADMIN_SERVICE_H_
#define SPECSERVE_SCHEDULER_ADMIN_SERVICE_H_

#include "proto/specserve.grpc.pb.h"
#include "scheduler/scheduler_context.h"

namespace specserve::scheduler {

class AdminService final : public specserve::v1::Admin::CallbackService {
 public:
  explicit AdminService(SchedulerContext* ctx) : ctx_(ctx) {}

  grpc::ServerUnaryReactor* GetServerInfo(
      grpc::CallbackServerContext* ctx,
      const specserve::v1::GetServerInfoRequest* request,
      specserve::v1::ServerInfo* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(
      grpc::CallbackServerContext* ctx,
      const specserve::v1::GetModelInfoRequest* request,
      specserve::v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* LoadModel(
      grpc::CallbackServerContext* ctx,
      const specserve::v1::LoadModelRequest* request,
      specserve::v1::LoadModelResponse* response) override;
  grpc::ServerUnaryReactor* Abort(
      grpc::CallbackServerContext* ctx,
      const specserve::v1::AbortRequest* request,
      specserve::v1::AbortResponse* response) override;
  grpc::ServerUnaryReactor* Drain(
      grpc::CallbackServerContext* ctx,
      const specserve::v1::DrainRequest* request,
      specserve::v1::DrainResponse* response) override;

 private:
  SchedulerContext* const ctx_;
};

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_ADMIN_SERVICE_H_
