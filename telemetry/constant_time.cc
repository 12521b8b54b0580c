#include "telemetry/constant_time.h"

#include "openssl/crypto.h"
#include "openssl/sha.h"

namespace specserve::telemetry {

SecretDigest DigestOf(absl::string_view secret) {
  SecretDigest digest;
  static_assert(sizeof(digest) == SHA256_DIGEST_LENGTH);
  SHA256(reinterpret_cast<const unsigned char*>(secret.data()), secret.size(),
         digest.data());
  return digest;
}

bool DigestsEqual(const SecretDigest& a, const SecretDigest& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  return DigestsEqual(DigestOf(a), DigestOf(b));
}

}  // namespace specserve::telemetry
