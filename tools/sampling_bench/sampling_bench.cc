// sampling_bench: host time to turn one row of logits into the filtered
// distribution a sampled request draws from (kernels/sampling/sampling.h), for the
// vocabulary of the Qwen3.5 models (248,320) and of the default model.
//
//   bazel run -c opt //tools/sampling_bench -- [--vocab=248320,...]
//       [--reps=10] [--json_out=FILE]
//
// Per filter setting: FilteredProbs (sorts only the prefix the filters read),
// the full-sort definition it equals (FilteredProbsByFullSort) and their
// ratio, beside the floor: the double-precision softmax over the row that
// both must compute. Logits are N(0, 3) draws; the nucleus of a flatter row
// spans more tokens, so top_p rows also run at temperature 2.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "tools/bench_timing/bench_timing.h"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_reference.h"

ABSL_FLAG(std::string, vocab, "248320,4096", "comma-separated vocabulary sizes");
ABSL_FLAG(int, reps, 10, "timed repetitions per cell (median)");
ABSL_FLAG(std::string, json_out, "", "write the results here as JSON");

namespace {

using specserve::sampling::FilteredProbs;
using specserve::sampling::FilteredProbsByFullSort;
using specserve::sampling::SamplingConfig;
using specserve::sampling::TemperatureSoftmax;
using specserve::bench::WallMs;

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  const std::vector<SamplingConfig> configs = {
      {0.8f, 0, 1.0f, 0.0f},  {0.8f, 50, 0.95f, 0.0f}, {0.8f, 0, 0.9f, 0.0f},
      {2.0f, 0, 0.9f, 0.0f},  {0.8f, 0, 1.0f, 0.05f},  {1.0f, 20, 0.8f, 0.05f}};
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%8s %6s %5s %6s %5s %10s %10s %8s %10s %8s\n", "vocab", "temp", "top_k",
              "top_p", "min_p", "filters_ms", "fullsort_ms", "x faster", "floor_ms",
              "x floor");
  for (absl::string_view v : absl::StrSplit(absl::GetFlag(FLAGS_vocab), ',')) {
    int vocab = 0;
    if (!absl::SimpleAtoi(v, &vocab) || vocab < 1) {
      std::fprintf(stderr, "bad --vocab entry '%s'\n", std::string(v).c_str());
      return 2;
    }
    std::mt19937 rng(7);
    std::normal_distribution<float> d(0.0f, 3.0f);
    std::vector<float> logits(vocab);
    for (float& x : logits) x = d(rng);
    for (const SamplingConfig& c : configs) {
      std::vector<float> probs;
      const double filters = WallMs(1, reps, [&] {
        if (!FilteredProbs(logits.data(), vocab, c, &probs).ok()) std::abort();
      });
      const double full = WallMs(1, reps, [&] { FilteredProbsByFullSort(logits, c); });
      // The floor: the softmax in double over the row (max, exp, sum, scale).
      std::vector<double> p;
      const double floor = WallMs(1, reps, [&] {
        p = TemperatureSoftmax(logits.data(), vocab,
                               *std::max_element(logits.begin(), logits.end()), c.temperature);
      });
      std::printf("%8d %6.2f %5d %6.2f %5.2f %10.2f %10.2f %8.1f %10.2f %8.2f\n", vocab,
                  c.temperature, c.top_k, c.top_p, c.min_p, filters, full, full / filters,
                  floor, filters / floor);
      rows.push_back({{"vocab", vocab}, {"temperature", c.temperature}, {"top_k", c.top_k},
                      {"top_p", c.top_p}, {"min_p", c.min_p}, {"filters_ms", filters},
                      {"full_sort_ms", full}, {"softmax_floor_ms", floor}});
    }
  }
  const std::string out = absl::GetFlag(FLAGS_json_out);
  if (!out.empty()) std::ofstream(out) << rows.dump(2) << "\n";
  return 0;
}
