#include "scheduler/generate_admission.h"

#include <utility>

#include "scheduler/worker_wait.h"
#include "telemetry/server_lifecycle.h"

namespace specserve::scheduler {
namespace {

absl::Status DrainingError() {
  return absl::UnavailableError("server is draining: no new work accepted");
}

}  // namespace

absl::Status GenerateAdmission::Reject(absl::Status s) const {
  ctx_->metrics->requests_rejected(s.code())->Increment();
  return s;
}

absl::Status GenerateAdmission::AwaitLimits() {
  if (telemetry::DrainRequested()) return DrainingError();
  if (ctx_->CurrentLimits(&limits_)) return absl::OkStatus();
  absl::StatusOr<AdmissionTicket> ticket = ctx_->admission->TryAdmit();
  if (!ticket.ok()) return Reject(ticket.status());
  waited_ticket_ = std::move(*ticket);
  grpc::ServerContext* const call = call_;
  absl::Status s = AwaitWorker(*ctx_, deadline(), [call]() -> absl::Status {
    if (call->IsCancelled()) {
      return absl::CancelledError("cancelled while waiting for a worker");
    }
    if (telemetry::DrainRequested()) return DrainingError();
    return absl::OkStatus();
  });
  if (s.ok() && !ctx_->CurrentLimits(&limits_)) {
    s = NoWorkerError(*ctx_->workers, absl::ZeroDuration());
  }
  if (!s.ok()) return Reject(std::move(s));
  return absl::OkStatus();
}

absl::StatusOr<AdmissionTicket> GenerateAdmission::Admit(
    const specserve::v1::GenerateRequest& request) {
  if (absl::Status valid = ValidateGenerateRequest(request, limits_);
      !valid.ok()) {
    return Reject(std::move(valid));
  }
  if (waited_ticket_.has_value()) {
    AdmissionTicket ticket = std::move(*waited_ticket_);
    waited_ticket_.reset();
    return ticket;
  }
  absl::StatusOr<AdmissionTicket> ticket = ctx_->admission->TryAdmit();
  if (!ticket.ok()) return Reject(ticket.status());
  return ticket;
}

}  // namespace specserve::scheduler
