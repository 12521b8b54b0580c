#include "tools/specserve_cli/cli.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/util/json_util.h"

namespace specserve::cli {
namespace {

absl::Mutex g_mu;
grpc::ClientContext* g_active ABSL_GUARDED_BY(g_mu) = nullptr;
std::atomic<bool> g_interrupted{false};

void WatchInterrupts(sigset_t set) {
  while (true) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    absl::MutexLock lock(&g_mu);
    if (g_active == nullptr) _exit(130);
    g_interrupted = true;
    g_active->TryCancel();
  }
}

// What a user can do about a failure with this code.
std::string Hint(grpc::StatusCode code, const Conn& conn) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
      return absl::StrCat("is a scheduler running at ", conn.address,
                          "? (--address HOST:PORT); it may also be draining "
                          "or have no available worker (see `info`)");
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "the --timeout passed before the server answered";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "the server is full; retry later";
    case grpc::StatusCode::NOT_FOUND:
      return "unknown session or request (see `session list`)";
    case grpc::StatusCode::ABORTED:
      return "a turn is already in flight on this session";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "this server does not provide it (yet)";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "this server needs a bearer token: --token TOKEN or "
             "$SPECSERVE_TOKEN";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "this needs a token with role admin";
    case grpc::StatusCode::CANCELLED:
      return "cancelled";
    default:
      return "";
  }
}

}  // namespace

std::unique_ptr<grpc::ClientContext> NewContext() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  const double timeout = absl::GetFlag(FLAGS_timeout);
  if (timeout > 0) {
    ctx->set_deadline(
        std::chrono::system_clock::now() +
        std::chrono::microseconds(static_cast<int64_t>(timeout * 1e6)));
  }
  const std::string token = absl::GetFlag(FLAGS_token);
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  return ctx;
}

void InstallInterruptHandler() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread(WatchInterrupts, set).detach();
}

CancelOnInterrupt::CancelOnInterrupt(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&g_mu);
  g_active = ctx;
}

CancelOnInterrupt::~CancelOnInterrupt() {
  absl::MutexLock lock(&g_mu);
  g_active = nullptr;
}

bool CancelOnInterrupt::interrupted() const { return g_interrupted; }

int ReportRpcError(absl::string_view what, const grpc::Status& status,
                   const Conn& conn) {
  const std::string code = absl::StatusCodeToString(
      static_cast<absl::StatusCode>(status.error_code()));
  std::string line = absl::StrCat("specserve_cli: ", what, ": ", code);
  if (!status.error_message().empty())
    absl::StrAppend(&line, ": ", status.error_message());
  const std::string hint = Hint(status.error_code(), conn);
  // A hint that only repeats the message adds nothing.
  if (!hint.empty() && hint != status.error_message())
    absl::StrAppend(&line, "\n  hint: ", hint);
  std::fprintf(stderr, "%s\n", line.c_str());
  return kExitRpc;
}

int UsageError(absl::string_view message) {
  std::fprintf(stderr, "specserve_cli: %s\n  (specserve_cli --help)\n",
               std::string(message).c_str());
  return kExitUsage;
}

absl::StatusOr<std::vector<uint32_t>> ParseIds(absl::string_view text) {
  std::vector<uint32_t> ids;
  for (absl::string_view part :
       absl::StrSplit(text, absl::ByAnyChar(", "), absl::SkipWhitespace())) {
    uint32_t id;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", part, "' is not a token id"));
    }
    ids.push_back(id);
  }
  return ids;
}

std::string ToJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(m, &out, options);
  return out;
}

std::string ResidencyName(v1::Residency r) {
  const std::string& n = v1::Residency_Name(r);
  return n.empty() ? absl::StrCat(static_cast<int>(r)) : n;
}

std::string DecodeModeName(v1::DecodeMode m) {
  const std::string& n = v1::DecodeMode_Name(m);
  return n.empty() ? absl::StrCat(static_cast<int>(m)) : n;
}

}  // namespace specserve::cli
