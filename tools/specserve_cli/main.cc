// specserve_cli: a command-line client of the public specserve.v1 API.
//
//   specserve_cli [--address HOST:PORT] COMMAND [ARGS] [FLAGS]
//
//   generate TEXT | - | --ids 1,2,3   stream the continuation to stdout
//       --max-tokens N --temperature T --top-p P --top-k K --min-p M --seed S
//       --spec / --k K                speculative decoding (draft depth K)
//       --new-session | --session ID [--rewind]   multi-turn sessions
//       --stop STR (repeatable, C escapes: --stop '\n\n') --stop-ids 1,2
//       --ignore-eos --stats --show-ids --request-id ID --capacity N
//   session open [--capacity N] | get ID | list | close ID
//   tokenize TEXT | -  [--noparse-special]     prints ids
//   detokenize 5,17,42 | -  [--skip-special]   prints text
//   info                                       server, workers, model
//   abort --request-id ID | --session ID
//
// Common flags: --address (default $SPECSERVE_ADDRESS or 127.0.0.1:50051),
// --token (a bearer token, default $SPECSERVE_TOKEN: for a scheduler with
// --auth_tokens), --timeout SECONDS (0 = none), --json (responses as JSON).
// Flags may be spelled with dashes or underscores and go before or after the
// command; `--` ends the flags (for a prompt that starts with a dash).
//
// Generated text goes to stdout exactly as streamed; session ids, ids and
// statistics go to stderr. Exit status: 0 ok, 1 the server refused or the
// call failed (the gRPC status code and message are printed), 2 bad usage,
// 130 cancelled by Ctrl-C (the server sees the call cancelled).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tools/specserve_cli/cli.h"

ABSL_FLAG(std::string, address, "",
          "scheduler address (default $SPECSERVE_ADDRESS or 127.0.0.1:50051)");
ABSL_FLAG(std::string, token, "",
          "bearer token sent with every call (a scheduler with "
          "--auth_tokens; default $SPECSERVE_TOKEN)");
ABSL_FLAG(double, timeout, 0, "deadline of each call in seconds (0 = none)");
ABSL_FLAG(bool, json, false, "print responses as JSON");
ABSL_FLAG(std::string, session, "",
          "generate: continue this session; session get/close, abort: the "
          "session");
// Declared for --help only: --stop is collected before flag parsing so that
// it can repeat.
ABSL_FLAG(std::string, stop, "",
          "generate: stop string (repeatable; C escapes such as \\n apply)");

namespace {

constexpr char kUsage[] =
    "specserve_cli [--address HOST:PORT] COMMAND [ARGS] [FLAGS]\n"
    "commands:\n"
    "  generate TEXT|-|--ids 1,2,3 [--max-tokens N] [--temperature T] "
    "[--top-p P] [--seed S]\n"
    "           [--spec] [--k K] [--session ID [--rewind] | --new-session] "
    "[--stop STR]... [--stats]\n"
    "  session open|get ID|list|close ID\n"
    "  tokenize TEXT|-\n"
    "  detokenize IDS|-\n"
    "  info\n"
    "  abort --request-id ID | --session ID";

}  // namespace

int main(int argc, char** argv) {
  // Dashes to underscores in flag names; pull out every --stop (it repeats).
  std::vector<std::string> args;
  std::vector<std::string> stops;
  bool flags_done = false;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (!flags_done && i > 0 && a == "--") flags_done = true;
    if (!flags_done && a.rfind("--", 0) == 0) {
      const size_t end = std::min(a.find('='), a.size());
      for (size_t j = 2; j < end; ++j)
        if (a[j] == '-') a[j] = '_';
      std::string value;
      bool is_stop = false;
      if (a == "--stop" && i + 1 < argc) {
        value = argv[++i];
        is_stop = true;
      } else if (a.rfind("--stop=", 0) == 0) {
        value = a.substr(7);
        is_stop = true;
      }
      if (is_stop) {
        std::string unescaped;
        std::string error;
        if (!absl::CUnescape(value, &unescaped, &error)) {
          std::fprintf(stderr, "specserve_cli: --stop '%s': %s\n",
                       value.c_str(), error.c_str());
          return specserve::cli::kExitUsage;
        }
        stops.push_back(unescaped);
        continue;
      }
    }
    args.push_back(a);
  }
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  absl::SetProgramUsageMessage(kUsage);
  // --help lists the flags of every file of this tool, not only main.cc's.
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view path) {
    return absl::StrContains(path, "tools/specserve_cli/");
  };
  absl::SetFlagsUsageConfig(usage_config);
  std::vector<char*> rest =
      absl::ParseCommandLine(static_cast<int>(cargs.size()), cargs.data());
  std::vector<std::string> words(rest.begin() + 1, rest.end());
  if (words.empty()) {
    std::fprintf(stderr, "%s\n", kUsage);
    return specserve::cli::kExitUsage;
  }
  const std::string command = words[0];
  words.erase(words.begin());

  specserve::cli::Conn conn;
  conn.address = absl::GetFlag(FLAGS_address);
  if (conn.address.empty()) {
    const char* env = std::getenv("SPECSERVE_ADDRESS");
    conn.address = env != nullptr && *env ? env : "127.0.0.1:50051";
  }
  if (absl::GetFlag(FLAGS_token).empty()) {
    const char* env = std::getenv("SPECSERVE_TOKEN");
    if (env != nullptr) absl::SetFlag(&FLAGS_token, env);
  }
  specserve::cli::InstallInterruptHandler();
  conn.channel =
      grpc::CreateChannel(conn.address, grpc::InsecureChannelCredentials());

  if (!stops.empty() && command != "generate")
    return specserve::cli::UsageError("--stop is a generate flag");
  if (command == "generate")
    return specserve::cli::RunGenerate(conn, words, stops);
  if (command == "session") return specserve::cli::RunSession(conn, words);
  if (command == "tokenize") return specserve::cli::RunTokenize(conn, words);
  if (command == "detokenize")
    return specserve::cli::RunDetokenize(conn, words);
  if (command == "info") return specserve::cli::RunInfo(conn, words);
  if (command == "abort") return specserve::cli::RunAbort(conn, words);
  return specserve::cli::UsageError(absl::StrCat(
      "unknown command '", command,
      "' (expected generate, session, tokenize, detokenize, info, abort)"));
}
