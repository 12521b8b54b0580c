// specserve_cli's shared pieces: the connection to the scheduler, per-call
// contexts (deadline, Ctrl-C cancellation), friendly error reports and the
// subcommands' entry points (one .cc per group). main.cc parses the flags
// and dispatches on the first positional word.
#ifndef SPECSERVE_TOOLS_SPECSERVE_CLI_CLI_H_
#define SPECSERVE_TOOLS_SPECSERVE_CLI_CLI_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "grpcpp/grpcpp.h"
#include "proto/specserve.grpc.pb.h"

ABSL_DECLARE_FLAG(std::string, address);
ABSL_DECLARE_FLAG(std::string, token);
ABSL_DECLARE_FLAG(double, timeout);
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(std::string, session);

namespace specserve::cli {

// Exit statuses: 0 ok, 1 the server refused or failed, 2 bad usage.
inline constexpr int kExitRpc = 1;
inline constexpr int kExitUsage = 2;

struct Conn {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
};

// A context with the --timeout deadline (none when 0) and the --token.
std::unique_ptr<grpc::ClientContext> NewContext();

// While a call runs, Ctrl-C cancels it (the server sees CANCELLED) instead
// of killing the process; outside calls Ctrl-C exits at once (status 130).
// InstallInterruptHandler must run before any gRPC thread starts.
void InstallInterruptHandler();
class CancelOnInterrupt {
 public:
  explicit CancelOnInterrupt(grpc::ClientContext* ctx);
  ~CancelOnInterrupt();
  bool interrupted() const;
};

// "specserve_cli: WHAT: CODE: message" on stderr, plus a hint for the
// codes a user can act on. Returns kExitRpc.
int ReportRpcError(absl::string_view what, const grpc::Status& status,
                   const Conn& conn);
// "specserve_cli: message" on stderr. Returns kExitUsage.
int UsageError(absl::string_view message);

// "1,2, 3" -> ids; INVALID_ARGUMENT naming the bad piece.
absl::StatusOr<std::vector<uint32_t>> ParseIds(absl::string_view text);

// The message as one JSON object (proto field names, defaults included).
std::string ToJson(const google::protobuf::Message& m);

// Subcommands; `args` are the positional words after the command name.
int RunGenerate(const Conn& conn, const std::vector<std::string>& args,
                const std::vector<std::string>& stop_strings);
int RunSession(const Conn& conn, const std::vector<std::string>& args);
int RunTokenize(const Conn& conn, const std::vector<std::string>& args);
int RunDetokenize(const Conn& conn, const std::vector<std::string>& args);
int RunInfo(const Conn& conn, const std::vector<std::string>& args);
int RunAbort(const Conn& conn, const std::vector<std::string>& args);

// Names of enum values without the proto prefix noise ("ACTIVE", "cpu").
std::string ResidencyName(v1::Residency r);
std::string DecodeModeName(v1::DecodeMode m);

}  // namespace specserve::cli

#endif  // SPECSERVE_TOOLS_SPECSERVE_CLI_CLI_H_
