// The bearer-token check for gRPC's server reflection service (grpcurl's
// `list` and `describe`), whose handlers are gRPC's own and so cannot start
// with SchedulerContext::Authenticate like ours (scheduler/authenticator.h).
//
// A server interceptor on the reflection methods only: a call that fails
// Authenticator::Authenticate has every response message replaced by a
// reflection error_response carrying UNAUTHENTICATED and the reason, and its
// status replaced by the same. So an unauthenticated client learns nothing
// of the schema (grpcurl prints the reason). Other methods get no
// interceptor: health stays open to everyone, and the public services check
// for themselves.
#ifndef SPECSERVE_SCHEDULER_REFLECTION_AUTH_H_
#define SPECSERVE_SCHEDULER_REFLECTION_AUTH_H_

#include "grpcpp/support/server_interceptor.h"
#include "scheduler/authenticator.h"

namespace specserve::scheduler {

class ReflectionAuthInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  // `auth` must outlive the server.
  explicit ReflectionAuthInterceptorFactory(const Authenticator* auth)
      : auth_(auth) {}

  // Null (no interceptor) for every method but reflection's, and for those
  // too while authentication is off.
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  const Authenticator* const auth_;
};

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_REFLECTION_AUTH_H_
