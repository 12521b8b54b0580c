// The worker's gRPC service (specserve.worker.v1.Worker), callback API.
//
// Today it reports what the worker runs (GetWorkerInfo). The session RPCs
// (admit, bursts, park/resume, rewind, demote) answer UNIMPLEMENTED with a
// message until the speculative-session engine lands; they never fake a result.
#ifndef SPECSERVE_WORKER_WORKER_SERVICE_H_
#define SPECSERVE_WORKER_WORKER_SERVICE_H_

#include <memory>
#include <string>

#include "proto/worker.grpc.pb.h"
#include "worker/model_files/checkpoint.h"

namespace specserve::worker {

struct WorkerOptions {
  std::string device = "cpu";  // "cpu" or "cuda:N"
  uint32_t default_capacity = 4096;
};

class WorkerService final : public specserve::worker::v1::Worker::CallbackService {
 public:
  // `checkpoint` is the loaded model; the service owns it.
  WorkerService(WorkerOptions options,
                std::unique_ptr<model_files::Checkpoint> checkpoint);

  grpc::ServerUnaryReactor* GetWorkerInfo(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::WorkerInfoRequest* request,
      specserve::worker::v1::WorkerInfo* response) override;
  grpc::ServerUnaryReactor* Admit(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::AdmitRequest* request,
      specserve::worker::v1::SessionState* response) override;
  grpc::ServerWriteReactor<specserve::worker::v1::BurstEvent>* Burst(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::BurstRequest* request) override;
  grpc::ServerUnaryReactor* Flush(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::SessionRef* request,
      specserve::worker::v1::SessionState* response) override;
  grpc::ServerUnaryReactor* Park(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::SessionRef* request,
      specserve::worker::v1::SessionState* response) override;
  grpc::ServerUnaryReactor* Resume(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::SessionRef* request,
      specserve::worker::v1::SessionState* response) override;
  grpc::ServerUnaryReactor* Rewind(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::SessionRef* request,
      specserve::worker::v1::SessionState* response) override;
  grpc::ServerUnaryReactor* Demote(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::SessionRef* request,
      specserve::worker::v1::SessionState* response) override;
  grpc::ServerUnaryReactor* Release(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::SessionRef* request,
      specserve::worker::v1::ReleaseResponse* response) override;
  grpc::ServerUnaryReactor* GetSessionState(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::SessionRef* request,
      specserve::worker::v1::SessionState* response) override;

 private:
  const WorkerOptions options_;
  const std::unique_ptr<model_files::Checkpoint> checkpoint_;
  const specserve::v1::ModelInfo model_info_;
};

}  // namespace specserve::worker

#endif  // SPECSERVE_WORKER_WORKER_SERVICE_H_
