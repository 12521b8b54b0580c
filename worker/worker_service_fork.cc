// WorkerService::ForkSession (proto/worker.proto): a new session copied
// from an idle one's state at a reusable position (worker/session_fork.h).
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "telemetry/grpc_reactors.h"
#include "telemetry/server_lifecycle.h"
#include "worker/session_fork.h"
#include "worker/worker_service.h"

namespace specserve::worker {

grpc::ServerUnaryReactor* WorkerService::ForkSession(
    grpc::CallbackServerContext* ctx,
    const specserve::worker::v1::ForkSessionRequest* request,
    specserve::worker::v1::SessionState* response) {
  using telemetry::FinishUnary;
  lease_.Renew();
  if (telemetry::DrainRequested()) return FinishUnary(ctx, Draining());
  const absl::StatusOr<int> capacity = NewSessionCapacity(request->capacity());
  if (!capacity.ok())
    return FinishUnary(ctx, telemetry::ToGrpc(capacity.status()));
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  // On a thread of its own: the copy takes the pool and the model (see
  // Burst in worker_service.cc).
  std::thread([this, ctx, reactor, request, response, capacity = *capacity] {
    const std::vector<uint32_t> prefix(request->prefix().begin(),
                                       request->prefix().end());
    std::unique_ptr<spec::SpecSession> fork;
    absl::Status s =
        pool_.WithIdle(request->source_session_id(), request->owner(),
                       [&](const spec::SpecSession& src) -> absl::Status {
                         auto f = worker::ForkSession(
                             &executor_, src, request->session_id(), capacity,
                             prefix, request->speculative());
                         if (!f.ok()) return f.status();
                         fork = std::move(*f);
                         return absl::OkStatus();
                       });
    if (!s.ok()) {
      reactor->Finish(telemetry::ToGrpc(s));
      return;
    }
    {
      auto lease = pool_.Insert(std::move(fork), request->owner());
      if (!lease.ok()) {
        reactor->Finish(telemetry::ToGrpc(lease.status()));
        return;
      }
      *response = StateOf(*lease->get(), /*busy=*/true);
    }
    if (ctx->IsCancelled()) {
      // The caller never learns of the copy (see Admit): free it now.
      pool_.Release(request->session_id(), request->owner()).IgnoreError();
      reactor->Finish(
          grpc::Status(grpc::StatusCode::CANCELLED, "fork cancelled"));
      return;
    }
    reactor->Finish(grpc::Status::OK);
  }).detach();
  return reactor;
}

}  // namespace specserve::worker
