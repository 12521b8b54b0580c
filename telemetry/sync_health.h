// grpc.health.v1.Health with synchronous handlers, for a server whose
// services are all synchronous (the scheduler). gRPC's built-in health
// service uses the callback API, and in gRPC 1.51 the first callback service
// of a process starts two completion-queue threads that take turns polling
// every socket of the process and wake each other for every event, even the
// events of synchronous calls: with them, a token streamed through the
// scheduler cost several thread wake-ups. Without any callback service there
// are none.
//
// Install it with InstallSyncHealthService before BuildAndStart: the server
// owns it and returns it from GetHealthCheckService() (ServeUntilDrained sets
// the statuses through that).
#ifndef SPECSERVE_TELEMETRY_SYNC_HEALTH_H_
#define SPECSERVE_TELEMETRY_SYNC_HEALTH_H_

#include <map>
#include <string>

#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "proto/health.grpc.pb.h"

namespace specserve::telemetry {

class SyncHealthService final : public grpc::HealthCheckServiceInterface,
                                public grpc::health::v1::Health::Service {
 public:
  // grpc::HealthCheckServiceInterface.
  void SetServingStatus(const std::string& service, bool serving) override;
  void SetServingStatus(bool serving) override;
  void Shutdown() override;

  // grpc.health.v1.Health. Check answers NOT_FOUND for an unknown service;
  // Watch sends SERVICE_UNKNOWN for it and keeps watching (as the spec says).
  grpc::Status Check(grpc::ServerContext* ctx,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;
  grpc::Status Watch(grpc::ServerContext* ctx,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>*
                         writer) override;

 private:
  using Status = grpc::health::v1::HealthCheckResponse::ServingStatus;
  Status StatusOfLocked(const std::string& service) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, Status> statuses_ ABSL_GUARDED_BY(mu_);
  // Bumped on every change, so a watcher sees that something changed.
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

// Gives `builder` a SyncHealthService (owned by the server it builds) and
// registers it.
void InstallSyncHealthService(grpc::ServerBuilder* builder);

}  // namespace specserve::telemetry

#endif  // SPECSERVE_TELEMETRY_SYNC_HEALTH_H_
