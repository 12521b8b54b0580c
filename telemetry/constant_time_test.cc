#include "telemetry/constant_time.h"

#include <string>

#include "gtest/gtest.h"

namespace specserve::telemetry {
namespace {

TEST(ConstantTimeTest, EqualAndUnequal) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("s3cret-token", "s3cret-token"));
  EXPECT_FALSE(ConstantTimeEquals("s3cret-token", "s3cret-tokem"));
  EXPECT_FALSE(ConstantTimeEquals("s3cret-token", "S3cret-token"));
  // A prefix, or the secret with something after it, is not the secret.
  EXPECT_FALSE(ConstantTimeEquals("s3cret", "s3cret-token"));
  EXPECT_FALSE(ConstantTimeEquals("s3cret-token\n", "s3cret-token"));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
  // Embedded NULs count: the comparison is over bytes, not C strings.
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0b", 3), std::string("a")));
  EXPECT_TRUE(
      ConstantTimeEquals(std::string("a\0b", 3), std::string("a\0b", 3)));
}

TEST(ConstantTimeTest, DigestIsSha256) {
  // FIPS 180-2 test vector.
  const SecretDigest d = DigestOf("abc");
  const uint8_t want[] = {0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea,
                          0x41, 0x41, 0x40, 0xde, 0x5d, 0xae, 0x22, 0x23,
                          0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17, 0x7a, 0x9c,
                          0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad};
  for (size_t i = 0; i < d.size(); ++i) EXPECT_EQ(d[i], want[i]) << i;
  EXPECT_TRUE(DigestsEqual(d, DigestOf("abc")));
  EXPECT_FALSE(DigestsEqual(d, DigestOf("abd")));
}

}  // namespace
}  // namespace specserve::telemetry
