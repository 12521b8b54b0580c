// The bearer-token credentials of the public API (specserve_scheduler
// --auth_tokens): the file format, and finding whose token a call presents.
//
// File format: one credential per line, `TOKEN TENANT ROLE`, the three fields
// separated by spaces or tabs. Blank lines and lines whose first non-blank
// character is '#' are skipped. A malformed line fails the whole file, the
// error naming the line number (never a field's value: the token would then
// be in the logs):
//   - TOKEN: at least kMinTokenLength visible ASCII characters (what an HTTP/2
//     header value can carry), each token on one line only;
//   - TENANT: letters, digits, '.', '_', '-' (at most 128); sessions and
//     requests belong to it (scheduler/session_table.h);
//   - ROLE: `user`, or `admin` (also LoadModel, Drain, Abort of everything).
// Several tokens may name one tenant (rotation: add the new one, reload,
// remove the old one, reload).
//
// Tokens are kept only as SHA-256 digests, and a presented token is compared
// with every stored one in constant time (telemetry/constant_time.h): how
// long a look-up takes says nothing about which token, or how much of one, a
// guess matched.
#ifndef SPECSERVE_SCHEDULER_CREDENTIALS_H_
#define SPECSERVE_SCHEDULER_CREDENTIALS_H_

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "telemetry/constant_time.h"

namespace specserve::scheduler {

enum class Role { kUser, kAdmin };

// "user" or "admin".
absl::string_view RoleName(Role role);

// Who makes a call: the tenant its token belongs to, and its role. Without
// --auth_tokens every call is Anonymous().
struct Caller {
  std::string tenant;
  Role role = Role::kUser;

  // The one tenant of a server without authentication: "" with role admin,
  // so every call is allowed, as before tokens existed.
  static Caller Anonymous() { return Caller{"", Role::kAdmin}; }
};

inline constexpr size_t kMinTokenLength = 16;
inline constexpr size_t kMaxTenantLength = 128;

class CredentialSet {
 public:
  // Parses a credential file's contents. `source` names the file in errors
  // ("FILE line N: ..."). INVALID_ARGUMENT for a malformed line, a token on
  // two lines, or a file with no credential at all.
  static absl::StatusOr<CredentialSet> Parse(absl::string_view text,
                                             absl::string_view source);
  // Reads and parses `path` (NOT_FOUND / PERMISSION_DENIED when it cannot be
  // read).
  static absl::StatusOr<CredentialSet> Load(const std::string& path);

  // The caller `token` authenticates, or nullopt for no credential's. Every
  // stored digest is compared, whichever matches.
  std::optional<Caller> Find(absl::string_view token) const;

  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    telemetry::SecretDigest digest;
    Caller caller;
  };
  std::vector<Entry> entries_;
};

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_CREDENTIALS_H_
