// `specserve_cli info | abort | tokenize | detokenize`.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <iterator>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tools/specserve_cli/cli.h"

ABSL_DECLARE_FLAG(std::string, request_id);
ABSL_FLAG(bool, parse_special, true,
          "tokenize: read special tokens (<|im_start|>) written in the text");
ABSL_FLAG(bool, skip_special, false,
          "detokenize: leave special tokens out of the text");

namespace specserve::cli {
namespace {

std::string Input(const std::vector<std::string>& args) {
  if (args.size() == 1 && args[0] == "-") {
    return std::string(std::istreambuf_iterator<char>(std::cin),
                       std::istreambuf_iterator<char>());
  }
  return absl::StrJoin(args, " ");
}

std::string LayerString(const v1::ModelInfo& m) {
  std::string s;
  for (int t : m.layer_types())
    s += t == v1::LINEAR_ATTENTION ? 'l' : t == v1::FULL_ATTENTION ? 'f' : '?';
  return s;
}

std::string Count(uint64_t n) {
  if (n >= 1000000000) return absl::StrFormat("%.2fB", n / 1e9);
  if (n >= 1000000) return absl::StrFormat("%.2fM", n / 1e6);
  if (n >= 1000) return absl::StrFormat("%.1fk", n / 1e3);
  return absl::StrCat(n);
}

void Row(const char* key, const std::string& value) {
  std::printf("  %-20s %s\n", key, value.c_str());
}

void PrintModel(const v1::ModelInfo& m) {
  std::printf("model:\n");
  Row("path", m.path());
  Row("architecture",
      absl::StrCat(m.architecture(), " (", m.model_type(), ")"));
  Row("vocab", absl::StrCat(m.vocab_size()));
  Row("hidden / mlp",
      absl::StrCat(m.hidden_size(), " / ", m.intermediate_size()));
  Row("layers", absl::StrCat(m.num_layers(), ": ", LayerString(m),
                             "  (l = linear attention, f = full attention)"));
  Row("attention",
      absl::StrCat(m.num_attention_heads(), " heads, ", m.num_key_value_heads(),
                   " kv heads, dim ", m.head_dim()));
  Row("linear attention",
      absl::StrCat(m.linear_num_key_heads(), " key heads, ",
                   m.linear_num_value_heads(), " value heads, dk ",
                   m.linear_key_head_dim(), ", dv ", m.linear_value_head_dim(),
                   ", conv ", m.linear_conv_kernel_dim()));
  Row("max context", absl::StrCat(m.max_context()));
  Row("mtp head", m.has_mtp()
                      ? absl::StrCat("yes (", m.mtp_num_layers(), " layer(s))")
                      : "no (no speculative decoding)");
  Row("tied embeddings", m.tie_word_embeddings() ? "yes" : "no");
  Row("dtype", m.dtype());
  Row("parameters",
      absl::StrFormat("%s (%.1f MiB of weights)", Count(m.parameter_count()),
                      m.weight_bytes() / 1048576.0));
  Row("eos ids", absl::StrJoin(m.eos_token_ids(), ","));
}

}  // namespace

int RunInfo(const Conn& conn, const std::vector<std::string>& args) {
  if (!args.empty()) return UsageError("info takes no arguments");
  auto stub = v1::Admin::NewStub(conn.channel);
  auto ctx = NewContext();
  CancelOnInterrupt cancel(ctx.get());
  v1::ServerInfo info;
  grpc::Status st = stub->GetServerInfo(ctx.get(), {}, &info);
  if (!st.ok()) return ReportRpcError("info", st, conn);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", ToJson(info).c_str());
    return 0;
  }
  int available = 0;
  for (const auto& w : info.workers()) available += w.available();
  std::printf("server:  %s at %s%s\n",
              info.version().empty() ? "specserve" : info.version().c_str(),
              conn.address.c_str(), info.draining() ? " (DRAINING)" : "");
  std::printf("workers: %d, %d available\n", info.workers_size(), available);
  std::printf("  %-21s %-9s %-8s %8s %10s  %s\n", "ADDRESS", "AVAILABLE",
              "DEVICE", "SESSIONS", "LAST SEEN", "DETAIL");
  for (const v1::WorkerStatus& w : info.workers()) {
    std::printf("  %-21s %-9s %-8s %8u %8.1fs  %s\n", w.address().c_str(),
                w.available() ? "yes" : "NO",
                w.device().empty() ? "-" : w.device().c_str(), w.sessions(),
                w.last_seen_seconds_ago(), w.detail().c_str());
  }
  if (info.has_model()) {
    PrintModel(info.model());
  } else {
    std::printf("model:   (no available worker reports one)\n");
  }
  return 0;
}

int RunAbort(const Conn& conn, const std::vector<std::string>& args) {
  v1::AbortRequest req;
  const std::string request = absl::GetFlag(FLAGS_request_id);
  const std::string session = absl::GetFlag(FLAGS_session);
  if (!args.empty() || request.empty() == session.empty())
    return UsageError(
        "abort: give exactly one of --request-id ID or --session ID");
  if (!request.empty()) {
    req.set_request_id(request);
  } else {
    req.set_session_id(session);
  }
  auto stub = v1::Admin::NewStub(conn.channel);
  auto ctx = NewContext();
  v1::AbortResponse resp;
  grpc::Status st = stub->Abort(ctx.get(), req, &resp);
  if (!st.ok()) return ReportRpcError("abort", st, conn);
  std::printf("aborted %u request(s)\n", resp.aborted());
  return 0;
}

int RunTokenize(const Conn& conn, const std::vector<std::string>& args) {
  if (args.empty()) return UsageError("tokenize: give TEXT (or - for stdin)");
  v1::TokenizeRequest req;
  req.set_text(Input(args));
  req.set_parse_special(absl::GetFlag(FLAGS_parse_special));
  auto stub = v1::Tokenization::NewStub(conn.channel);
  auto ctx = NewContext();
  v1::TokenizeResponse resp;
  grpc::Status st = stub->Tokenize(ctx.get(), req, &resp);
  if (!st.ok()) return ReportRpcError("tokenize", st, conn);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("[%s]\n", absl::StrJoin(resp.ids(), ", ").c_str());
  } else {
    std::printf("%s\n", absl::StrJoin(resp.ids(), ",").c_str());
  }
  return 0;
}

int RunDetokenize(const Conn& conn, const std::vector<std::string>& args) {
  auto ids = ParseIds(Input(args));
  if (!ids.ok())
    return UsageError(absl::StrCat("detokenize: ", ids.status().message()));
  if (ids->empty()) return UsageError("detokenize: give IDS (e.g. 5,17,42)");
  v1::DetokenizeRequest req;
  for (uint32_t id : *ids) req.add_ids(id);
  req.set_skip_special(absl::GetFlag(FLAGS_skip_special));
  auto stub = v1::Tokenization::NewStub(conn.channel);
  auto ctx = NewContext();
  v1::DetokenizeResponse resp;
  grpc::Status st = stub->Detokenize(ctx.get(), req, &resp);
  if (!st.ok()) return ReportRpcError("detokenize", st, conn);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", ToJson(resp).c_str());
    return 0;
  }
  std::fwrite(resp.text().data(), 1, resp.text().size(), stdout);
  if (isatty(STDOUT_FILENO) &&
      (resp.text().empty() || resp.text().back() != '\n'))
    std::fputc('\n', stdout);
  return 0;
}

}  // namespace specserve::cli
