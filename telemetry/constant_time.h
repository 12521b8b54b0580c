// Comparing secrets (bearer tokens, the scheduler's worker owner token)
// without leaking through timing how much of a guess was right.
//
// Each secret is reduced to its SHA-256 digest and digests are compared with
// OpenSSL's CRYPTO_memcmp, whose running time depends only on the length it
// is given (always 32 bytes here). So the time of a comparison does not
// depend on the stored secret's length or content, nor on how many leading
// bytes a guess got right.
#ifndef SPECSERVE_TELEMETRY_CONSTANT_TIME_H_
#define SPECSERVE_TELEMETRY_CONSTANT_TIME_H_

#include <array>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace specserve::telemetry {

using SecretDigest = std::array<uint8_t, 32>;

// SHA-256 of `secret`.
SecretDigest DigestOf(absl::string_view secret);

// Whether two digests are equal, in time independent of their contents.
bool DigestsEqual(const SecretDigest& a, const SecretDigest& b);

// Whether `a` == `b`, in time independent of the contents and of where they
// first differ (it hashes both, so it takes time linear in their lengths).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace specserve::telemetry

#endif  // SPECSERVE_TELEMETRY_CONSTANT_TIME_H_
