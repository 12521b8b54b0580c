// `specserve_cli session open|get|list|close`.
#include <cstdio>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tools/specserve_cli/cli.h"

ABSL_DECLARE_FLAG(int, capacity);

namespace specserve::cli {
namespace {

std::string Telemetry(const v1::SessionTelemetry& t) {
  std::vector<std::string> rates;
  for (int i = 0; i < t.drafted_per_position_size(); ++i) {
    const double d = t.drafted_per_position(i);
    const double a =
        i < t.accepted_per_position_size() ? t.accepted_per_position(i) : 0;
    rates.push_back(absl::StrFormat("%.2f", d > 0 ? a / d : 0.0));
  }
  return absl::StrFormat(
      "rounds %u, drafted %u, accepted %u, tokens/round %.2f, accept rate by "
      "position [%s]",
      t.rounds(), t.drafted(), t.accepted(),
      t.rounds() ? 1.0 + static_cast<double>(t.accepted()) / t.rounds() : 0.0,
      absl::StrJoin(rates, ", "));
}

void PrintSession(const v1::SessionInfo& s) {
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", ToJson(s).c_str());
    return;
  }
  std::printf("session:    %s\n", s.session_id().c_str());
  std::printf("residency:  %s%s\n", ResidencyName(s.residency()).c_str(),
              s.busy() ? " (busy: a request is in flight)" : "");
  std::printf("mode:       %s\n", DecodeModeName(s.mode()).c_str());
  std::printf("worker:     %s\n",
              s.worker().empty() ? "-" : s.worker().c_str());
  std::printf("committed:  %u of %u rows\n", s.committed_tokens(),
              s.capacity());
  std::printf("rewind_pos: %s\n",
              s.has_rewind_pos() ? absl::StrCat(s.rewind_pos()).c_str() : "-");
  std::printf("telemetry:  %s\n", Telemetry(s.telemetry()).c_str());
  if (s.has_last_gate_decision()) {
    const v1::GateDecision& g = s.last_gate_decision();
    std::printf(
        "gate:       %s (acceptance %.3f, expected tokens/round %.2f, verify "
        "cost ratio %.2f, batch %u)%s%s\n",
        DecodeModeName(g.mode()).c_str(), g.measured_acceptance(),
        g.expected_tokens_per_round(), g.verify_cost_ratio(), g.batch_size(),
        g.reason().empty() ? "" : ": ", g.reason().c_str());
  }
}

}  // namespace

int RunSession(const Conn& conn, const std::vector<std::string>& args) {
  if (args.empty())
    return UsageError("session: expected open, get ID, list or close ID");
  const std::string& verb = args[0];
  const std::string id =
      args.size() > 1 ? args[1] : absl::GetFlag(FLAGS_session);
  auto stub = v1::Sessions::NewStub(conn.channel);
  auto ctx = NewContext();
  CancelOnInterrupt cancel(ctx.get());
  if (verb == "open") {
    v1::OpenSessionRequest req;
    req.set_capacity(absl::GetFlag(FLAGS_capacity));
    v1::SessionInfo info;
    grpc::Status st = stub->OpenSession(ctx.get(), req, &info);
    if (!st.ok()) return ReportRpcError("session open", st, conn);
    if (absl::GetFlag(FLAGS_json)) {
      std::printf("%s\n", ToJson(info).c_str());
    } else {
      std::printf("%s\n", info.session_id().c_str());
    }
    return 0;
  }
  if (verb == "list") {
    v1::ListSessionsResponse resp;
    grpc::Status st = stub->ListSessions(ctx.get(), {}, &resp);
    if (!st.ok()) return ReportRpcError("session list", st, conn);
    if (absl::GetFlag(FLAGS_json)) {
      std::printf("%s\n", ToJson(resp).c_str());
      return 0;
    }
    std::printf("%-36s %-10s %-11s %-21s %9s %8s %6s %4s\n", "SESSION",
                "RESIDENCY", "MODE", "WORKER", "COMMITTED", "CAPACITY",
                "ROUNDS", "BUSY");
    for (const v1::SessionInfo& s : resp.sessions()) {
      std::printf("%-36s %-10s %-11s %-21s %9u %8u %6llu %4s\n",
                  s.session_id().c_str(), ResidencyName(s.residency()).c_str(),
                  DecodeModeName(s.mode()).c_str(),
                  s.worker().empty() ? "-" : s.worker().c_str(),
                  s.committed_tokens(), s.capacity(),
                  static_cast<unsigned long long>(s.telemetry().rounds()),
                  s.busy() ? "yes" : "no");
    }
    std::printf("%d session(s)\n", resp.sessions_size());
    return 0;
  }
  if (verb == "get" || verb == "close") {
    if (id.empty())
      return UsageError(absl::StrCat("session ", verb, ": give a session ID"));
    if (verb == "get") {
      v1::GetSessionRequest req;
      req.set_session_id(id);
      v1::SessionInfo info;
      grpc::Status st = stub->GetSession(ctx.get(), req, &info);
      if (!st.ok()) return ReportRpcError("session get", st, conn);
      PrintSession(info);
      return 0;
    }
    v1::CloseSessionRequest req;
    req.set_session_id(id);
    v1::CloseSessionResponse resp;
    grpc::Status st = stub->CloseSession(ctx.get(), req, &resp);
    if (!st.ok()) return ReportRpcError("session close", st, conn);
    std::printf("closed %s\n", id.c_str());
    return 0;
  }
  return UsageError(absl::StrCat("session: unknown verb '", verb,
                                 "' (expected open, get, list, close)"));
}

}  // namespace specserve::cli
