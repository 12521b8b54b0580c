// tokenizer_bench: single-threaded encode throughput of the C++ tokenizer.
//
//   tokenizer_bench --tokenizer=PATH/tokenizer.json --input=LINES.jsonl
//       [--min_seconds=2] [--json_out=FILE]
//
// LINES.jsonl holds one JSON string per line; each is one Encode call. Prints
// one summary line and, with --json_out, a JSON object: bytes, lines, tokens,
// the first (cold-cache) pass and the best warm pass in seconds and MB/s (1 MB
// = 1e6 bytes). Usually run by bench.py, which measures HF tokenizers on the
// same lines.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "nlohmann/json.hpp"
#include "scheduler/tokenizer/tokenizer.h"

ABSL_FLAG(std::string, tokenizer, "", "path to tokenizer.json");
ABSL_FLAG(std::string, input, "", "JSON lines file: one string per line");
ABSL_FLAG(double, min_seconds, 2.0,
          "keep repeating warm passes at least this long");
ABSL_FLAG(std::string, json_out, "", "write the results here as JSON");

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const auto t0 = Clock::now();
  auto tok =
      specserve::tokenizer::Tokenizer::Load(absl::GetFlag(FLAGS_tokenizer));
  if (!tok.ok()) {
    std::cerr << "tokenizer_bench: " << tok.status() << "\n";
    return 2;
  }
  const double load_s = Seconds(t0, Clock::now());
  std::ifstream in(absl::GetFlag(FLAGS_input));
  if (!in) {
    std::cerr << "tokenizer_bench: cannot read --input\n";
    return 2;
  }
  std::vector<std::string> lines;
  size_t bytes = 0;
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_string()) {
      std::cerr << "tokenizer_bench: input lines must be JSON strings\n";
      return 2;
    }
    lines.push_back(j.get<std::string>());
    bytes += lines.back().size();
  }

  size_t tokens = 0;
  auto pass = [&] {
    size_t n = 0;
    const auto start = Clock::now();
    for (const std::string& line : lines) n += (*tok)->Encode(line).size();
    tokens = n;
    return Seconds(start, Clock::now());
  };
  const double cold_s = pass();
  double best_s = 1e30, total_s = 0;
  int passes = 0;
  while (total_s < absl::GetFlag(FLAGS_min_seconds) || passes < 3) {
    const double s = pass();
    best_s = std::min(best_s, s);
    total_s += s;
    ++passes;
  }
  const json result = {
      {"impl", "specserve C++"}, {"tokenizer", absl::GetFlag(FLAGS_tokenizer)},
      {"bytes", bytes},          {"lines", lines.size()},
      {"tokens", tokens},        {"load_s", load_s},
      {"cold_s", cold_s},        {"cold_mb_s", bytes / cold_s / 1e6},
      {"warm_s", best_s},        {"warm_mb_s", bytes / best_s / 1e6},
      {"warm_passes", passes},
  };
  std::cout << "specserve C++: " << bytes << " bytes, " << lines.size()
            << " lines, " << tokens << " tokens; cold " << bytes / cold_s / 1e6
            << " MB/s, warm " << bytes / best_s / 1e6 << " MB/s\n";
  const std::string out = absl::GetFlag(FLAGS_json_out);
  if (!out.empty()) std::ofstream(out) << result.dump(2) << "\n";
  return 0;
}
