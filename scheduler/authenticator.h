// Who makes each public API call, and what the call may do
// (docs/RELIABILITY.md rows 12 and 13; README.md "Security").
//
// With --auth_tokens every call except grpc.health.v1 carries the metadata
// `authorization: Bearer TOKEN` naming one of the file's credentials
// (scheduler/credentials.h). Every handler of the public services starts with
// SchedulerContext::Authenticate, which comes here; gRPC's reflection service,
// whose handlers are gRPC's own, is checked by the same Authenticate from a
// server interceptor (scheduler/reflection_auth.h). A call without a valid
// token ends UNAUTHENTICATED before it does anything, the message saying
// what is missing. Without --auth_tokens every call is Caller::Anonymous().
//
// The credentials are replaced as a whole by Reload (SIGHUP): a call sees the
// old set or the new one, never a mix; a file that does not parse on reload
// keeps the old set.
#ifndef SPECSERVE_SCHEDULER_AUTHENTICATOR_H_
#define SPECSERVE_SCHEDULER_AUTHENTICATOR_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/string_ref.h"
#include "scheduler/credentials.h"

namespace specserve::scheduler {

// The metadata key of the bearer token (gRPC lower-cases keys).
inline constexpr char kAuthorizationMetadata[] = "authorization";

using CallMetadata = std::multimap<grpc::string_ref, grpc::string_ref>;

class Authenticator {
 public:
  // Off until Load: every call is Caller::Anonymous().
  Authenticator() = default;
  Authenticator(const Authenticator&) = delete;
  Authenticator& operator=(const Authenticator&) = delete;

  // Turns authentication on with the credentials of `path`, which Reload
  // reads again. The error names the file and the line.
  absl::Status Load(const std::string& path);
  // Reads the file given to Load again and replaces the credentials; on an
  // error the old ones stay. Returns how many credentials are in force.
  absl::StatusOr<size_t> Reload();

  bool enabled() const;

  // The caller of a call with client metadata `metadata`; UNAUTHENTICATED,
  // saying what is wrong, without a valid bearer token.
  absl::StatusOr<Caller> Authenticate(const CallMetadata& metadata) const;

 private:
  std::string path_;  // set once, by Load (before any call is served)
  mutable absl::Mutex mu_;
  std::shared_ptr<const CredentialSet> credentials_ ABSL_GUARDED_BY(mu_);
};

// OK for an admin; PERMISSION_DENIED naming `what` (e.g. "Admin.Drain")
// and the caller's role otherwise.
absl::Status RequireAdmin(const Caller& caller, absl::string_view what);

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_AUTHENTICATOR_H_
