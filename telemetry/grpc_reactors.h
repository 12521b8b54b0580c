// Small helpers for callback-API services: finish a unary call, or a server
// stream, with a status.
#ifndef SPECSERVE_TELEMETRY_GRPC_REACTORS_H_
#define SPECSERVE_TELEMETRY_GRPC_REACTORS_H_

#include <utility>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"

namespace specserve::telemetry {

inline grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx,
                                             grpc::Status status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(std::move(status));
  return reactor;
}

// absl::Status codes are gRPC's codes: the one boundary conversion.
inline grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

// A server stream that ends at once with `status` (e.g. a refused request).
template <typename T>
class FinishedWriteReactor final : public grpc::ServerWriteReactor<T> {
 public:
  explicit FinishedWriteReactor(grpc::Status status) {
    this->Finish(std::move(status));
  }
  void OnDone() override { delete this; }
};

}  // namespace specserve::telemetry

#endif  // SPECSERVE_TELEMETRY_GRPC_REACTORS_H_
