#include "telemetry/tls_credentials.h"

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specserve::telemetry {
namespace {

using ::testing::HasSubstr;

// The checks here read only the PEM armour; real certificates and
// handshakes are tests/e2e/test_tls.py's.
constexpr char kCert[] =
    "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
constexpr char kKey[] =
    "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n";

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(IsLoopbackListenAddress, LoopbackHostsOnly) {
  for (const char* a :
       {"127.0.0.1:50051", "127.1.2.3:0", "localhost:50051", "LocalHost:1",
        "[::1]:50051", "[::ffff:127.0.0.1]:5", "unix:/tmp/specserve.sock",
        "unix-abstract:specserve"}) {
    EXPECT_TRUE(IsLoopbackListenAddress(a)) << a;
  }
  for (const char* a :
       {"0.0.0.0:50051", "[::]:50051", ":50051", "10.0.0.5:50051",
        "128.0.0.1:1", "[2001:db8::1]:50051", "example.com:50051",
        "localhost.example.com:1", "[::1:50051", "[::ffff:10.0.0.1]:5"}) {
    EXPECT_FALSE(IsLoopbackListenAddress(a)) << a;
  }
}

TEST(MakeServerCredentials, NoFilesIsPlaintext) {
  ServerTlsFiles files;
  EXPECT_FALSE(files.enabled());
  auto creds = MakeServerCredentials(files);
  ASSERT_TRUE(creds.ok()) << creds.status();
  EXPECT_NE(*creds, nullptr);
}

TEST(MakeServerCredentials, TlsAndMutualTls) {
  ServerTlsFiles files;
  files.cert = WriteFile("server.pem", kCert);
  files.key = WriteFile("server.key", kKey);
  auto tls = MakeServerCredentials(files);
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_NE(*tls, nullptr);
  files.client_ca = WriteFile("ca.pem", kCert);
  auto mtls = MakeServerCredentials(files);
  ASSERT_TRUE(mtls.ok()) << mtls.status();
  EXPECT_NE(*mtls, nullptr);
}

TEST(MakeServerCredentials, ErrorsNameTheFile) {
  ServerTlsFiles files;
  files.cert = ::testing::TempDir() + "/missing.pem";
  files.key = WriteFile("server.key", kKey);
  auto missing = MakeServerCredentials(files);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr(files.cert));
  EXPECT_THAT(missing.status().message(), HasSubstr("cannot open"));

  // A key where the certificate belongs.
  files.cert = files.key;
  auto swapped = MakeServerCredentials(files);
  ASSERT_FALSE(swapped.ok());
  EXPECT_THAT(swapped.status().message(), HasSubstr(files.cert));
  EXPECT_THAT(swapped.status().message(), HasSubstr("not a PEM certificate"));

  files.cert = WriteFile("server.pem", kCert);
  files.client_ca = WriteFile("not_pem.txt", "hello");
  auto bad_ca = MakeServerCredentials(files);
  ASSERT_FALSE(bad_ca.ok());
  EXPECT_THAT(bad_ca.status().message(), HasSubstr(files.client_ca));
}

TEST(MakeServerCredentials, IncompleteFlagsRefused) {
  ServerTlsFiles cert_only;
  cert_only.cert = WriteFile("server.pem", kCert);
  EXPECT_FALSE(MakeServerCredentials(cert_only).ok());
  ServerTlsFiles ca_only;
  ca_only.client_ca = WriteFile("ca.pem", kCert);
  EXPECT_FALSE(MakeServerCredentials(ca_only).ok());
}

TEST(MakeChannelSecurity, PlaintextTlsAndClientCertificate) {
  ChannelTlsFiles files;
  auto plain = MakeChannelSecurity(files);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->tls());
  EXPECT_NE(plain->Dial("127.0.0.1:1", {}), nullptr);
  files.ca = WriteFile("ca.pem", kCert);
  auto tls = MakeChannelSecurity(files);
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_TRUE(tls->tls());
  files.cert = WriteFile("client.pem", kCert);
  files.key = WriteFile("client.key", kKey);
  files.server_name = "localhost";
  auto mtls = MakeChannelSecurity(files);
  ASSERT_TRUE(mtls.ok()) << mtls.status();
  EXPECT_TRUE(mtls->tls());
  EXPECT_EQ(mtls->server_name, "localhost");
  EXPECT_NE(mtls->Dial("127.0.0.1:1", {}), nullptr);
}

TEST(MakeChannelSecurity, IncompleteFlagsRefused) {
  ChannelTlsFiles no_ca;
  no_ca.cert = WriteFile("client.pem", kCert);
  no_ca.key = WriteFile("client.key", kKey);
  EXPECT_FALSE(MakeChannelSecurity(no_ca).ok());
  ChannelTlsFiles name_only;
  name_only.server_name = "localhost";
  EXPECT_FALSE(MakeChannelSecurity(name_only).ok());
  ChannelTlsFiles key_missing;
  key_missing.ca = WriteFile("ca.pem", kCert);
  key_missing.cert = WriteFile("client.pem", kCert);
  EXPECT_FALSE(MakeChannelSecurity(key_missing).ok());
  ChannelTlsFiles bad_key = key_missing;
  bad_key.key = WriteFile("client.pem.2", kCert);
  auto s = MakeChannelSecurity(bad_key);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr(bad_key.key));
  EXPECT_THAT(s.status().message(), HasSubstr("not a PEM private key"));
}

}  // namespace
}  // namespace specserve::telemetry
