// specserve.v1.Admin: server and model info (from the worker pool), drain.
// LoadModel and Abort answer UNIMPLEMENTED with a message until sessions and
// hot reload land.
#ifndef SPECSERVE_SCHEDULER_ADMIN_SERVICE_H_
#define SPECSERVE_SCHEDULER_ADMIN_SERVICE_H_

#include "proto/specserve.grpc.pb.h"
#include "scheduler/worker_pool.h"

namespace specserve::scheduler {

class AdminService final : public specserve::v1::Admin::CallbackService {
 public:
  explicit AdminService(const WorkerPool* pool) : pool_(pool) {}

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
  const WorkerPool* const pool_;
};

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_ADMIN_SERVICE_H_
