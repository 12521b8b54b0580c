// `specserve_cli generate`: one Generate call, text streamed to stdout as the
// deltas arrive; session ids, ids and statistics go to stderr so stdout is
// exactly the generated text.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <optional>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tools/specserve_cli/cli.h"

ABSL_FLAG(std::string, ids, "",
          "generate: input token ids (comma-separated) instead of text");
ABSL_FLAG(int, max_tokens, 0,
          "generate: most tokens to generate (0 = up to the context)");
ABSL_FLAG(double, temperature, 0.0, "generate: temperature (0 = greedy)");
ABSL_FLAG(double, top_p, 0.0, "generate: nucleus filter in (0, 1]; 0 = off");
ABSL_FLAG(int, top_k, 0, "generate: keep the K most likely tokens; 0 = off");
ABSL_FLAG(double, min_p, 0.0, "generate: min-p filter in [0, 1); 0 = off");
ABSL_FLAG(uint64_t, seed, 0, "generate: Philox seed (0 = server picks one)");
ABSL_FLAG(bool, spec, false, "generate: request speculative decoding");
ABSL_FLAG(int, k, 0,
          "generate: draft depth 1..8 (implies --spec; 0 = server default)");
ABSL_FLAG(bool, new_session, false,
          "generate: create a session for this turn (its id goes to stderr)");
ABSL_FLAG(bool, rewind, false,
          "generate: with --session, go back to the last prompt checkpoint "
          "first (regenerate / edit the last turn)");
ABSL_FLAG(int, capacity, 0,
          "generate --new-session / session open: session rows (0 = default)");
ABSL_FLAG(std::string, stop_ids, "",
          "generate: token ids that end generation (comma-separated)");
ABSL_FLAG(bool, ignore_eos, false, "generate: do not stop at EOS");
ABSL_FLAG(bool, stats, false,
          "generate: print usage and speculative statistics at the end");
ABSL_FLAG(bool, show_ids, false,
          "generate: print the generated ids at the end");
ABSL_FLAG(std::string, request_id, "",
          "generate: request id (for `abort`); abort: the request to cancel");

namespace specserve::cli {
namespace {

using Clock = std::chrono::steady_clock;

std::string FinishName(v1::FinishReason r) {
  const std::string& n = v1::FinishReason_Name(r);
  return n.empty() ? absl::StrCat(static_cast<int>(r)) : n;
}

void PrintStats(const v1::GenerateFinal& f, double ttft_s, double total_s,
                size_t streamed) {
  const v1::Usage& u = f.usage();
  std::fprintf(stderr, "finish: %s\n", FinishName(f.finish_reason()).c_str());
  std::fprintf(stderr,
               "usage: prompt %u (cached %u), completion %u (overshoot %u)\n",
               u.prompt_tokens(), u.cached_prompt_tokens(),
               u.completion_tokens(), u.overshoot_tokens());
  if (f.has_spec_stats() && f.spec_stats().rounds() == 0) {
    std::fprintf(stderr, "spec: no speculative rounds (plain decode)\n");
  } else if (f.has_spec_stats()) {
    const v1::SpecStats& s = f.spec_stats();
    std::vector<std::string> rates;
    for (int i = 0; i < s.drafted_per_position_size(); ++i) {
      const double d = s.drafted_per_position(i);
      const double a =
          i < s.accepted_per_position_size() ? s.accepted_per_position(i) : 0.0;
      rates.push_back(absl::StrFormat("%.2f", d > 0 ? a / d : 0.0));
    }
    const double per_round =
        s.rounds() ? 1.0 + static_cast<double>(s.accepted()) / s.rounds() : 0;
    std::fprintf(stderr,
                 "spec: rounds %llu, drafted %llu, accepted %llu, "
                 "tokens/round %.2f (bonus included), accept rate by "
                 "position [%s]%s\n",
                 static_cast<unsigned long long>(s.rounds()),
                 static_cast<unsigned long long>(s.drafted()),
                 static_cast<unsigned long long>(s.accepted()), per_round,
                 absl::StrJoin(rates, ", ").c_str(),
                 s.demoted() ? ", demoted to plain decode" : "");
  }
  if (!f.request_id().empty())
    std::fprintf(stderr, "request: %s\n", f.request_id().c_str());
  if (f.seed() != 0 && absl::GetFlag(FLAGS_temperature) > 0)
    std::fprintf(stderr, "seed: %llu\n",
                 static_cast<unsigned long long>(f.seed()));
  std::fprintf(stderr,
               "client: first token after %.1f ms; %zu tokens in %.3f s",
               1e3 * ttft_s, streamed, total_s);
  if (streamed > 1 && total_s > ttft_s)
    std::fprintf(stderr, " (%.1f tokens/s after the first)",
                 (streamed - 1) / (total_s - ttft_s));
  std::fprintf(stderr, "\n");
}

}  // namespace

int RunGenerate(const Conn& conn, const std::vector<std::string>& args,
                const std::vector<std::string>& stop_strings) {
  v1::GenerateRequest req;
  const std::string ids_flag = absl::GetFlag(FLAGS_ids);
  if (!ids_flag.empty()) {
    if (!args.empty())
      return UsageError("generate: give TEXT or --ids, not both");
    auto ids = ParseIds(ids_flag);
    if (!ids.ok())
      return UsageError(absl::StrCat("--ids: ", ids.status().message()));
    if (ids->empty()) return UsageError("--ids is empty");
    for (uint32_t id : *ids) req.mutable_token_ids()->add_ids(id);
  } else {
    std::string text;
    if (args.size() == 1 && args[0] == "-") {
      text.assign(std::istreambuf_iterator<char>(std::cin),
                  std::istreambuf_iterator<char>());
    } else {
      text = absl::StrJoin(args, " ");
    }
    const std::string session = absl::GetFlag(FLAGS_session);
    // An empty input continues a session; elsewhere it is a mistake.
    if (text.empty() && session.empty())
      return UsageError(
          "generate: give a prompt (TEXT, - for stdin, or --ids 1,2,3)");
    req.set_text(text);
  }

  v1::SamplingParams* sp = req.mutable_sampling();
  sp->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  sp->set_top_p(static_cast<float>(absl::GetFlag(FLAGS_top_p)));
  sp->set_top_k(static_cast<uint32_t>(std::max(0, absl::GetFlag(FLAGS_top_k))));
  sp->set_min_p(static_cast<float>(absl::GetFlag(FLAGS_min_p)));
  sp->set_seed(absl::GetFlag(FLAGS_seed));

  v1::StoppingParams* st = req.mutable_stopping();
  if (absl::GetFlag(FLAGS_max_tokens) < 0)
    return UsageError("--max-tokens must be >= 0");
  st->set_max_tokens(absl::GetFlag(FLAGS_max_tokens));
  for (const std::string& s : stop_strings) st->add_stop(s);
  auto stop_ids = ParseIds(absl::GetFlag(FLAGS_stop_ids));
  if (!stop_ids.ok())
    return UsageError(
        absl::StrCat("--stop-ids: ", stop_ids.status().message()));
  for (uint32_t id : *stop_ids) st->add_stop_token_ids(id);
  st->set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));

  const int k = absl::GetFlag(FLAGS_k);
  if (k < 0) return UsageError("--k must be >= 0");
  req.mutable_speculation()->set_enable(absl::GetFlag(FLAGS_spec) || k > 0);
  req.mutable_speculation()->set_k(k);

  const bool stats = absl::GetFlag(FLAGS_stats);
  const bool show_ids = absl::GetFlag(FLAGS_show_ids);
  req.mutable_response()->set_text(true);
  // Ids always: they make the client's token counts exact.
  req.mutable_response()->set_ids(true);
  req.mutable_response()->set_spec_stats(stats);

  const std::string session = absl::GetFlag(FLAGS_session);
  const bool new_session = absl::GetFlag(FLAGS_new_session);
  if (!session.empty() && new_session)
    return UsageError("give --session ID or --new-session, not both");
  if (absl::GetFlag(FLAGS_rewind) && session.empty())
    return UsageError("--rewind needs --session ID");
  if (!session.empty() || new_session) {
    v1::SessionTurn* turn = req.mutable_session();
    turn->set_session_id(session);
    turn->set_mode(absl::GetFlag(FLAGS_rewind) ? v1::SessionTurn::REWIND
                                               : v1::SessionTurn::APPEND);
    turn->set_capacity(absl::GetFlag(FLAGS_capacity));
  }
  req.set_request_id(absl::GetFlag(FLAGS_request_id));

  auto stub = v1::Generation::NewStub(conn.channel);
  auto ctx = NewContext();
  CancelOnInterrupt cancel(ctx.get());
  const auto t0 = Clock::now();
  auto reader = stub->Generate(ctx.get(), req);
  v1::GenerateEvent ev;
  std::optional<v1::GenerateFinal> final;
  std::vector<uint32_t> ids;
  size_t streamed = 0;
  double ttft = 0;
  bool ends_with_newline = true;
  while (reader->Read(&ev)) {
    if (ev.has_delta()) {
      const v1::TokenDelta& d = ev.delta();
      const size_t n = d.ids_size();
      if (streamed == 0 && n > 0)
        ttft = std::chrono::duration<double>(Clock::now() - t0).count();
      streamed += n;
      ids.insert(ids.end(), d.ids().begin(), d.ids().end());
      if (!d.text().empty()) {
        std::fwrite(d.text().data(), 1, d.text().size(), stdout);
        std::fflush(stdout);
        ends_with_newline = d.text().back() == '\n';
      }
    } else if (ev.has_final()) {
      final = ev.final();
    }
  }
  const grpc::Status status = reader->Finish();
  const double total = std::chrono::duration<double>(Clock::now() - t0).count();
  // Keep a terminal's prompt on its own line; a pipe gets the exact text.
  if (!ends_with_newline && isatty(STDOUT_FILENO)) std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!status.ok()) {
    if (cancel.interrupted()) {
      std::fprintf(stderr, "specserve_cli: generate: cancelled (Ctrl-C)\n");
      return 130;
    }
    return ReportRpcError("generate", status, conn);
  }
  if (!final) {
    std::fprintf(stderr,
                 "specserve_cli: generate: the stream ended without "
                 "a final event\n");
    return kExitRpc;
  }
  if (new_session)
    std::fprintf(stderr, "session: %s\n", final->session_id().c_str());
  if (show_ids)
    std::fprintf(stderr, "ids: %s\n", absl::StrJoin(ids, ",").c_str());
  if (stats) PrintStats(*final, ttft, total, streamed);
  if (absl::GetFlag(FLAGS_json))
    std::fprintf(stderr, "%s\n", ToJson(*final).c_str());
  return 0;
}

}  // namespace specserve::cli
