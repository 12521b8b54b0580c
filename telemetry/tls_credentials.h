// Transport security of the gRPC ports, shared by both processes: gRPC
// credentials built from PEM files (TLS, and mutual TLS when a client CA is
// given), and whether a listen address is reachable only from this machine.
// The *_main.cc files turn their flags into these structs; every failure to
// read or use a file is an absl::Status naming the file, so a process with a
// bad TLS flag exits at start-up instead of serving plaintext.
#ifndef SPECSERVE_TELEMETRY_TLS_CREDENTIALS_H_
#define SPECSERVE_TELEMETRY_TLS_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace specserve::telemetry {

// A server's side of TLS. Every field is a PEM file path; empty = unset.
struct ServerTlsFiles {
  // The server's certificate chain and private key: both or neither. Neither
  // = plaintext (then client_ca must be empty too).
  std::string cert;
  std::string key;
  // Mutual TLS: every client must present a certificate this CA signed; a
  // client without one, or with another CA's, fails the handshake.
  std::string client_ca;

  bool enabled() const { return !cert.empty(); }
};

// TLS credentials for `files`, or insecure ones when !files.enabled().
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsFiles& files);

// A client's side of TLS. Every field but server_name is a PEM file path.
struct ChannelTlsFiles {
  // The CA that signed the servers' certificates; the server's certificate
  // is verified against it alone. Empty = plaintext (then every other field
  // must be empty too).
  std::string ca;
  // This client's certificate chain and private key, for servers that
  // require one: both or neither.
  std::string cert;
  std::string key;
  // The name checked on the server's certificate when it differs from the
  // host of the address dialled (certificates for "localhost" dialled at
  // 127.0.0.1). Empty = the address's host.
  std::string server_name;

  bool enabled() const { return !ca.empty(); }
};

// How a client dials servers: credentials, and the name to check on their
// certificates. The default (null credentials) is plaintext.
struct ChannelSecurity {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string server_name;  // empty = the host of the address dialled

  bool tls() const { return credentials != nullptr; }
  // A channel to `address` with `args` plus what TLS needs.
  std::shared_ptr<grpc::Channel> Dial(const std::string& address,
                                      grpc::ChannelArguments args) const;
};

// TLS (mutual when files.cert is given) for `files`, or plaintext when
// !files.enabled().
absl::StatusOr<ChannelSecurity> MakeChannelSecurity(
    const ChannelTlsFiles& files);

// Whether `listen` (a gRPC listen address: host:port, [v6]:port, unix:path)
// accepts connections only from this machine: 127.0.0.0/8, ::1 (also as
// ::ffff:127.x.y.z), localhost, or a unix socket. A wildcard (0.0.0.0, [::],
// an empty host) or any other host is reachable from the network.
bool IsLoopbackListenAddress(absl::string_view listen);

}  // namespace specserve::telemetry

#endif  // SPECSERVE_TELEMETRY_TLS_CREDENTIALS_H_
