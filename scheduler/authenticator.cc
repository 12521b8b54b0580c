#include "scheduler/authenticator.h"

#include <iterator>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace specserve::scheduler {

absl::Status Authenticator::Load(const std::string& path) {
  absl::StatusOr<CredentialSet> set = CredentialSet::Load(path);
  if (!set.ok()) return set.status();
  path_ = path;
  absl::MutexLock lock(&mu_);
  credentials_ = std::make_shared<const CredentialSet>(*std::move(set));
  return absl::OkStatus();
}

absl::StatusOr<size_t> Authenticator::Reload() {
  if (path_.empty()) {
    return absl::FailedPreconditionError("no --auth_tokens file to reload");
  }
  absl::StatusOr<CredentialSet> set = CredentialSet::Load(path_);
  if (!set.ok()) return set.status();
  const size_t n = set->size();
  absl::MutexLock lock(&mu_);
  credentials_ = std::make_shared<const CredentialSet>(*std::move(set));
  return n;
}

bool Authenticator::enabled() const {
  absl::MutexLock lock(&mu_);
  return credentials_ != nullptr;
}

absl::StatusOr<Caller> Authenticator::Authenticate(
    const CallMetadata& metadata) const {
  std::shared_ptr<const CredentialSet> credentials;
  {
    absl::MutexLock lock(&mu_);
    credentials = credentials_;
  }
  if (credentials == nullptr) return Caller::Anonymous();
  const auto [first, last] = metadata.equal_range(kAuthorizationMetadata);
  if (first == last) {
    return absl::UnauthenticatedError(
        "missing credentials: this server needs the call metadata "
        "'authorization: Bearer TOKEN'");
  }
  if (std::next(first) != last) {
    return absl::UnauthenticatedError(
        "more than one 'authorization' metadata entry: send one");
  }
  absl::string_view value(first->second.data(), first->second.size());
  // The scheme is case-insensitive (RFC 7235).
  constexpr absl::string_view kScheme = "bearer ";
  if (value.size() < kScheme.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme)) {
    return absl::UnauthenticatedError(
        "the 'authorization' metadata must be 'Bearer TOKEN'");
  }
  const absl::string_view token =
      absl::StripAsciiWhitespace(value.substr(kScheme.size()));
  if (token.empty()) {
    return absl::UnauthenticatedError(
        "the 'authorization' metadata carries an empty bearer token");
  }
  std::optional<Caller> caller = credentials->Find(token);
  if (!caller.has_value()) {
    return absl::UnauthenticatedError(
        "invalid bearer token: it is not one of this server's credentials "
        "(unknown, or revoked)");
  }
  return *std::move(caller);
}

absl::Status RequireAdmin(const Caller& caller, absl::string_view what) {
  if (caller.role == Role::kAdmin) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      what, " needs role admin; this token has role ", RoleName(caller.role)));
}

}  // namespace specserve::scheduler
