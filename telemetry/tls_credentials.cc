#include "telemetry/tls_credentials.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "telemetry/status_macros.h"

namespace specserve::telemetry {
namespace {

// What a PEM file must hold, checked here because gRPC takes the bytes as
// given: a key file passed as the certificate would surface only as a failed
// handshake (or a server that does not start) with no file named.
enum class PemKind { kCertificate, kPrivateKey };

absl::StatusOr<std::string> ReadPem(const std::string& path, PemKind kind,
                                    absl::string_view what) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, ": cannot open: ", std::strerror(errno)));
  }
  std::string data;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) data.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, ": read error"));
  }
  const bool looks_right =
      kind == PemKind::kCertificate
          ? absl::StrContains(data, "-----BEGIN CERTIFICATE-----")
          : absl::StrContains(data, "-----BEGIN ") &&
                absl::StrContains(data, "PRIVATE KEY-----");
  if (!looks_right) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " ", path, ": not a PEM ",
        kind == PemKind::kCertificate ? "certificate" : "private key",
        " (no -----BEGIN ",
        kind == PemKind::kCertificate ? "CERTIFICATE" : "... PRIVATE KEY",
        "----- line)"));
  }
  return data;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsFiles& files) {
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(
        "TLS: a server certificate and its private key go together (give "
        "both or neither)");
  }
  if (!files.enabled()) {
    if (!files.client_ca.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TLS: client CA ", files.client_ca,
          " given without a server certificate and key: mutual TLS needs "
          "TLS"));
    }
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions options(
      files.client_ca.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  SS_ASSIGN_OR_RETURN(
      pair.cert_chain,
      ReadPem(files.cert, PemKind::kCertificate, "TLS server certificate"));
  SS_ASSIGN_OR_RETURN(pair.private_key, ReadPem(files.key, PemKind::kPrivateKey,
                                                "TLS server private key"));
  options.pem_key_cert_pairs.push_back(std::move(pair));
  if (!files.client_ca.empty()) {
    SS_ASSIGN_OR_RETURN(
        options.pem_root_certs,
        ReadPem(files.client_ca, PemKind::kCertificate, "TLS client CA"));
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<ChannelSecurity> MakeChannelSecurity(
    const ChannelTlsFiles& files) {
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(
        "TLS: a client certificate and its private key go together (give "
        "both or neither)");
  }
  if (!files.enabled()) {
    if (!files.cert.empty() || !files.server_name.empty()) {
      return absl::InvalidArgumentError(
          "TLS: a client certificate or server name needs the CA that "
          "signed the servers' certificates");
    }
    return ChannelSecurity{};
  }
  grpc::SslCredentialsOptions options;
  // Always a CA of our own: an empty pem_root_certs would make gRPC trust
  // the system's public roots instead.
  SS_ASSIGN_OR_RETURN(
      options.pem_root_certs,
      ReadPem(files.ca, PemKind::kCertificate, "TLS server CA"));
  if (!files.cert.empty()) {
    SS_ASSIGN_OR_RETURN(
        options.pem_cert_chain,
        ReadPem(files.cert, PemKind::kCertificate, "TLS client certificate"));
    SS_ASSIGN_OR_RETURN(
        options.pem_private_key,
        ReadPem(files.key, PemKind::kPrivateKey, "TLS client private key"));
  }
  ChannelSecurity security;
  security.credentials = grpc::SslCredentials(options);
  security.server_name = files.server_name;
  return security;
}

std::shared_ptr<grpc::Channel> ChannelSecurity::Dial(
    const std::string& address, grpc::ChannelArguments args) const {
  if (!tls()) {
    return grpc::CreateCustomChannel(address,
                                     grpc::InsecureChannelCredentials(), args);
  }
  if (!server_name.empty()) {
    args.SetString(GRPC_SSL_TARGET_NAME_OVERRIDE_ARG, server_name);
  }
  return grpc::CreateCustomChannel(address, credentials, args);
}

bool IsLoopbackListenAddress(absl::string_view listen) {
  if (absl::StartsWith(listen, "unix:") ||
      absl::StartsWith(listen, "unix-abstract:")) {
    return true;
  }
  std::string host;
  if (absl::ConsumePrefix(&listen, "[")) {
    const size_t end = listen.find(']');
    if (end == absl::string_view::npos) return false;
    host = std::string(listen.substr(0, end));
  } else {
    const size_t colon = listen.rfind(':');
    host = std::string(
        colon == absl::string_view::npos ? listen : listen.substr(0, colon));
  }
  if (absl::EqualsIgnoreCase(host, "localhost")) return true;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&v6) ||
           (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  }
  return false;
}

}  // namespace specserve::telemetry
