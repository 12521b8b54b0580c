#include "scheduler/credentials.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace specserve::scheduler {
namespace {

bool IsVisibleAscii(absl::string_view s) {
  for (char c : s) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

bool IsTenantName(absl::string_view s) {
  if (s.empty() || s.size() > kMaxTenantLength) return false;
  for (char c : s) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::string_view RoleName(Role role) {
  return role == Role::kAdmin ? "admin" : "user";
}

absl::StatusOr<CredentialSet> CredentialSet::Parse(absl::string_view text,
                                                   absl::string_view source) {
  CredentialSet set;
  std::vector<int> line_of;  // line_of[i]: the line of entries_[i]
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    absl::ConsumeSuffix(&line, "\r");
    const absl::string_view content = absl::StripAsciiWhitespace(line);
    if (content.empty() || content.front() == '#') continue;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, " line ", line_no, ": ", why));
    };
    std::vector<absl::string_view> fields =
        absl::StrSplit(content, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 3) {
      return bad(absl::StrCat("expected 'TOKEN TENANT ROLE', got ",
                              fields.size(), " field(s)"));
    }
    const absl::string_view token = fields[0];
    if (!IsVisibleAscii(token)) {
      return bad("the token must be visible ASCII characters");
    }
    if (token.size() < kMinTokenLength) {
      return bad(absl::StrCat("the token is shorter than ", kMinTokenLength,
                              " characters"));
    }
    // No field is echoed: a line with its columns mixed up may carry the
    // token anywhere, and this message goes to the log.
    if (!IsTenantName(fields[1])) {
      return bad(absl::StrCat("the tenant must be 1 to ", kMaxTenantLength,
                              " letters, digits, '.', '_' or '-'"));
    }
    Entry e;
    e.caller.tenant = std::string(fields[1]);
    if (fields[2] == "user") {
      e.caller.role = Role::kUser;
    } else if (fields[2] == "admin") {
      e.caller.role = Role::kAdmin;
    } else {
      return bad("the role must be 'user' or 'admin'");
    }
    e.digest = telemetry::DigestOf(token);
    for (size_t i = 0; i < set.entries_.size(); ++i) {
      if (set.entries_[i].digest == e.digest) {
        return bad(absl::StrCat("the token of line ", line_of[i], " again"));
      }
    }
    set.entries_.push_back(std::move(e));
    line_of.push_back(line_no);
  }
  if (set.entries_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, " holds no credential (lines 'TOKEN TENANT ROLE')"));
  }
  return set;
}

absl::StatusOr<CredentialSet> CredentialSet::Load(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    const std::string why =
        absl::StrCat("cannot read ", path, ": ", std::strerror(err));
    return err == EACCES ? absl::PermissionDeniedError(why)
                         : absl::NotFoundError(why);
  }
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return absl::DataLossError(absl::StrCat("error reading ", path));
  return Parse(text, path);
}

std::optional<Caller> CredentialSet::Find(absl::string_view token) const {
  const telemetry::SecretDigest digest = telemetry::DigestOf(token);
  const Entry* found = nullptr;
  // No early exit: every stored digest is compared.
  for (const Entry& e : entries_) {
    const bool equal = telemetry::DigestsEqual(e.digest, digest);
    if (equal && found == nullptr) found = &e;
  }
  if (found == nullptr) return std::nullopt;
  return found->caller;
}

}  // namespace specserve::scheduler
