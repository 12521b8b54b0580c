// The admission steps of a Generate request, shared by every front end that
// runs one (specserve.v1 Generation, public_services.h; the gateway's
// vllm.grpc.engine.VllmEngine, scheduler/vllm_engine/), so each refuses the
// same requests with the same statuses, in the same order:
//   1. AwaitLimits, before the request is parsed: UNAVAILABLE while draining;
//      the model's limits, waiting for a worker when none is available
//      (scheduler/worker_wait.h) while holding an admission ticket, so that
//      waiting requests are bounded like queued ones.
//   2. Admit, once the request is known: ValidateGenerateRequest, then the
//      ticket (the one held while waiting, or a new one: RESOURCE_EXHAUSTED
//      with a retry hint when the queue is full).
// Nothing is tokenized or queued for a request refused here. Every refusal
// but the drain's is counted in specserve_requests_rejected_total.
//
// Usage, on the request's own thread:
//   GenerateAdmission admission(ctx, server_context);
//   SS_RETURN_IF_ERROR(admission.AwaitLimits());
//   ... parse, translate ...
//   SS_ASSIGN_OR_RETURN(AdmissionTicket ticket, admission.Admit(request));
//   RunGenerateCall(ctx, request, tenant, admission.deadline(), ticket, ...);
#ifndef SPECSERVE_SCHEDULER_GENERATE_ADMISSION_H_
#define SPECSERVE_SCHEDULER_GENERATE_ADMISSION_H_

#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"
#include "proto/specserve.pb.h"
#include "scheduler/admission.h"
#include "scheduler/request_validation.h"
#include "scheduler/scheduler_context.h"

namespace specserve::scheduler {

class GenerateAdmission {
 public:
  // Both must outlive this object.
  GenerateAdmission(SchedulerContext* ctx, grpc::ServerContext* call)
      : ctx_(ctx), call_(call) {}

  // Step 1; on OK, limits() holds the current model's limits.
  absl::Status AwaitLimits();
  const Limits& limits() const { return limits_; }
  // Step 2 (after an OK AwaitLimits): validation, then the ticket.
  absl::StatusOr<AdmissionTicket> Admit(
      const specserve::v1::GenerateRequest& request);
  // The client's deadline.
  absl::Time deadline() const { return absl::FromChrono(call_->deadline()); }
  // Counts `s` as a rejected request and returns it.
  absl::Status Reject(absl::Status s) const;

 private:
  SchedulerContext* const ctx_;
  grpc::ServerContext* const call_;
  Limits limits_;
  std::optional<AdmissionTicket> waited_ticket_;
};

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_GENERATE_ADMISSION_H_
