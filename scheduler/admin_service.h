// specserve.v1.Admin: server and model info (from the worker pool), model
// switch (load_model.h), abort by request or session, drain.
#ifndef SPECSERVE_SCHEDULER_ADMIN_SERVICE_H_
#define SPECSERVE_SCHEDULER_ADMIN_SERVICE_H_

#include "proto/specserve.grpc.pb.h"
#include "scheduler/scheduler_context.h"

namespace specserve::scheduler {

class AdminService final : public specserve::v1::Admin::Service {
 public:
  explicit AdminService(SchedulerContext* ctx) : ctx_(ctx) {}

  grpc::Status GetServerInfo(grpc::ServerContext* ctx,
                             const specserve::v1::GetServerInfoRequest* request,
                             specserve::v1::ServerInfo* response) override;
  grpc::Status GetModelInfo(grpc::ServerContext* ctx,
                            const specserve::v1::GetModelInfoRequest* request,
                            specserve::v1::ModelInfo* response) override;
  grpc::Status LoadModel(grpc::ServerContext* ctx,
                         const specserve::v1::LoadModelRequest* request,
                         specserve::v1::LoadModelResponse* response) override;
  grpc::Status Abort(grpc::ServerContext* ctx,
                     const specserve::v1::AbortRequest* request,
                     specserve::v1::AbortResponse* response) override;
  grpc::Status Drain(grpc::ServerContext* ctx,
                     const specserve::v1::DrainRequest* request,
                     specserve::v1::DrainResponse* response) override;

 private:
  SchedulerContext* const ctx_;
};

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_ADMIN_SERVICE_H_
