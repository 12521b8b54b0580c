#include "telemetry/sync_health.h"

#include <memory>

#include "grpcpp/ext/health_check_service_server_builder_option.h"

namespace specserve::telemetry {

using grpc::health::v1::HealthCheckResponse;

void SyncHealthService::SetServingStatus(const std::string& service,
                                         bool serving) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;  // Shutdown() is final
  statuses_[service] =
      serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
  ++version_;
}

void SyncHealthService::SetServingStatus(bool serving) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  for (auto& [name, status] : statuses_) {
    status = serving ? HealthCheckResponse::SERVING
                     : HealthCheckResponse::NOT_SERVING;
  }
  ++version_;
}

void SyncHealthService::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  for (auto& [name, status] : statuses_) {
    status = HealthCheckResponse::NOT_SERVING;
  }
  shut_down_ = true;
  ++version_;
}

SyncHealthService::Status SyncHealthService::StatusOfLocked(
    const std::string& service) const {
  auto it = statuses_.find(service);
  return it == statuses_.end() ? HealthCheckResponse::SERVICE_UNKNOWN
                               : it->second;
}

grpc::Status SyncHealthService::Check(
    grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest* request,
    HealthCheckResponse* response) {
  absl::MutexLock lock(&mu_);
  const Status status = StatusOfLocked(request->service());
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service");
  }
  response->set_status(status);
  return grpc::Status::OK;
}

grpc::Status SyncHealthService::Watch(
    grpc::ServerContext* ctx,
    const grpc::health::v1::HealthCheckRequest* request,
    grpc::ServerWriter<HealthCheckResponse>* writer) {
  bool first = true;
  uint64_t seen = 0;  // version_ when the status was last looked at
  Status sent = HealthCheckResponse::UNKNOWN;
  while (!ctx->IsCancelled()) {
    Status status;
    {
      absl::MutexLock lock(&mu_);
      if (!first) {
        // Cancellation is no lock condition: it is looked at every 100 ms.
        const auto changed = [this, &seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                                 mu_) { return version_ != seen; };
        mu_.AwaitWithTimeout(absl::Condition(&changed),
                             absl::Milliseconds(100));
      }
      seen = version_;
      status = StatusOfLocked(request->service());
    }
    if (first || status != sent) {
      HealthCheckResponse response;
      response.set_status(status);
      if (!writer->Write(response)) break;
      sent = status;
      first = false;
    }
  }
  return grpc::Status::OK;
}

void InstallSyncHealthService(grpc::ServerBuilder* builder) {
  auto service = std::make_unique<SyncHealthService>();
  builder->RegisterService(service.get());
  builder->SetOption(
      std::make_unique<grpc::HealthCheckServiceServerBuilderOption>(
          std::move(service)));
}

}  // namespace specserve::telemetry
