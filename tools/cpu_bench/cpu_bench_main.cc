// cpu_bench: measures the CPU backend's decode speed for a model directory
// and sets it beside the floor a memory-bound decode cannot beat:
//   floor = weight bytes read per decode step / read bandwidth,
// with the bandwidth measured in the same run (a multi-threaded read of a
// buffer much larger than the caches, same thread count as the backend).
// Also times Verify passes of T columns (what a speculative round costs).
// Prints a table and writes the full results as JSON (--out).
//
//   bazel run //tools/cpu_bench -- [--model models/default] [--out FILE]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/matmul.h"
#include "nlohmann/json.hpp"
#include "telemetry/status_macros.h"
#include "worker/model/model.h"

ABSL_FLAG(std::string, model, "models/default", "model directory");
ABSL_FLAG(std::string, out, "cpu_bench.json", "JSON results file");
ABSL_FLAG(int, threads, 0, "CPU threads (0 = one per core)");
ABSL_FLAG(int, prompt, 32, "prompt tokens before timing decode");
ABSL_FLAG(double, seconds, 2.0, "minimum seconds of timed decode");
ABSL_FLAG(int, window, 128,
          "decode steps per timed run (context prompt..prompt+window)");
ABSL_FLAG(int, bandwidth_mib, 1024, "MiB read per bandwidth pass");

namespace specserve::tools {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string ResolvePath(const std::string& path) {
  const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  if (path.empty() || path[0] == '/' || ws == nullptr) return path;
  return absl::StrCat(ws, "/", path);
}

// Best-of-5 read bandwidth in bytes/s over `bytes` with `threads` readers.
double ReadBandwidth(size_t bytes, int threads) {
  const size_t n = bytes / sizeof(uint64_t);
  std::vector<uint64_t> buf(n);
  for (size_t i = 0; i < n; ++i) buf[i] = i * 0x9E3779B97F4A7C15ull;
  std::vector<uint64_t> sums(threads);
  double best = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto t0 = Clock::now();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        const size_t b = n * t / threads, e = n * (t + 1) / threads;
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        size_t i = b;
        for (; i + 4 <= e; i += 4) {
          s0 += buf[i];
          s1 += buf[i + 1];
          s2 += buf[i + 2];
          s3 += buf[i + 3];
        }
        for (; i < e; ++i) s0 += buf[i];
        sums[t] = s0 + s1 + s2 + s3;
      });
    }
    for (auto& t : ts) t.join();
    best = std::max(best, bytes / Since(t0));
  }
  // Keep the sums alive so the reads are not optimized away.
  if (std::accumulate(sums.begin(), sums.end(), uint64_t{0}) == 42)
    std::puts("");
  return best;
}

absl::Status Run() {
  const std::string dir = ResolvePath(absl::GetFlag(FLAGS_model));
  kernels::cpu::CpuBackend backend({absl::GetFlag(FLAGS_threads)});
  const int threads = backend.num_threads();
  const auto t_load = Clock::now();
  SS_ASSIGN_OR_RETURN(auto model, model::Model::Load(dir, &backend));
  const double load_s = Since(t_load);
  const model::ModelConfig& c = model->config();

  const double bw = ReadBandwidth(
      static_cast<size_t>(absl::GetFlag(FLAGS_bandwidth_mib)) << 20, threads);
  const uint64_t step_bytes = model->decode_weight_bytes();

  const int prompt_len = absl::GetFlag(FLAGS_prompt);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, c.vocab_size - 1);
  std::vector<int32_t> prompt(prompt_len);
  for (auto& t : prompt) t = tok(rng);

  // Decode: greedy over positions [prompt, prompt + window), repeated from a
  // fresh prefill until the time budget is used, so that every timed step
  // sees the same context lengths.
  const int window = absl::GetFlag(FLAGS_window);
  const int capacity = prompt_len + window + 32;
  SS_ASSIGN_OR_RETURN(auto state, model->NewState({.capacity = capacity}));
  model::ForwardResult r;
  double prefill_s = 0, decode_s = 0;
  int steps = 0, prefills = 0;
  const double budget = absl::GetFlag(FLAGS_seconds);
  const auto t_all = Clock::now();
  while (Since(t_all) < budget || prefills < 2) {
    SS_RETURN_IF_ERROR(model->Reset(state.get()));
    const auto t_prefill = Clock::now();
    SS_RETURN_IF_ERROR(model->Prefill(state.get(), prompt, {}, &r));
    prefill_s += Since(t_prefill);
    ++prefills;
    int32_t next = r.argmax.back();
    const auto t_decode = Clock::now();
    for (int i = 0; i < window; ++i) {
      SS_RETURN_IF_ERROR(model->Decode(state.get(), next, &r));
      next = r.argmax[0];
    }
    // The first round warms caches and the thread pool: not counted.
    if (prefills > 1) {
      decode_s += Since(t_decode);
      steps += window;
    }
  }
  prefill_s /= prefills;
  const double ms_per_token = 1e3 * decode_s / steps;
  const double floor_ms = 1e3 * step_bytes / bw;

  // Verify passes of T columns at position prompt + window (then discarded).
  nlohmann::json verify = nlohmann::json::array();
  std::vector<std::pair<int, double>> verify_ms;
  for (int T : {1, 2, 4, 8, 16}) {
    std::vector<int32_t> cols(T);
    for (auto& t : cols) t = tok(rng);
    int reps = 0;
    const auto t0 = Clock::now();
    while (Since(t0) < budget / 5 || reps < 3) {
      SS_RETURN_IF_ERROR(model->Verify(state.get(), cols, &r));
      model->DiscardVerified(state.get());
      ++reps;
    }
    const double ms = 1e3 * Since(t0) / reps;
    verify_ms.push_back({T, ms});
    verify.push_back(
        {{"columns", T}, {"ms_per_pass", ms}, {"ms_per_column", ms / T}});
  }

  std::printf(
      "cpu_bench: %s (%s, %d layers, H=%d, V=%d, %s weights), %d threads, %s\n",
      dir.c_str(), c.model_type.c_str(), c.num_hidden_layers, c.hidden_size,
      c.vocab_size, model_files::DTypeName(model->checkpoint().dtype()),
      threads, kernels::cpu::MatmulUsesAvx2() ? "AVX2+FMA" : "portable");
  std::printf("%-34s %14s\n", "metric", "value");
  std::printf("%-34s %14.1f\n", "load ms", 1e3 * load_s);
  std::printf("%-34s %14.3f\n", "weight MB read per decode step",
              step_bytes / 1e6);
  std::printf("%-34s %14.2f\n", "read bandwidth GB/s (measured)", bw / 1e9);
  std::printf("%-34s %14.4f\n", "floor ms/token (bytes/bandwidth)", floor_ms);
  std::printf("%-34s %14.1f\n", "ceiling tokens/s", 1e3 / floor_ms);
  std::printf("%-34s %14s\n", "decode context (positions)",
              absl::StrCat(prompt_len, "..", prompt_len + window).c_str());
  std::printf("%-34s %14.4f\n", "decode ms/token (measured)", ms_per_token);
  std::printf("%-34s %14.1f\n", "decode tokens/s (measured)",
              1e3 / ms_per_token);
  std::printf("%-34s %13.1f%%\n", "decode / ceiling",
              100.0 * floor_ms / ms_per_token);
  std::printf("%-34s %14.1f\n", "prefill tokens/s", prompt_len / prefill_s);
  for (const auto& [T, ms] : verify_ms) {
    std::printf("%-34s %14.4f\n",
                absl::StrCat("verify T=", T, " ms/pass").c_str(), ms);
  }

  nlohmann::json j = {
      {"model", dir},
      {"model_type", c.model_type},
      {"weights_dtype", model_files::DTypeName(model->checkpoint().dtype())},
      {"threads", threads},
      {"simd", kernels::cpu::MatmulUsesAvx2() ? "avx2" : "portable"},
      {"load_ms", 1e3 * load_s},
      {"decode_weight_bytes", step_bytes},
      {"read_bandwidth_bytes_per_s", bw},
      {"floor_ms_per_token", floor_ms},
      {"ceiling_tokens_per_s", 1e3 / floor_ms},
      {"decode_steps", steps},
      {"decode_ms_per_token", ms_per_token},
      {"decode_tokens_per_s", 1e3 / ms_per_token},
      {"decode_fraction_of_ceiling", floor_ms / ms_per_token},
      {"prompt_tokens", prompt_len},
      {"decode_window", window},
      {"prefill_tokens_per_s", prompt_len / prefill_s},
      {"verify", verify},
  };
  const std::string out = ResolvePath(absl::GetFlag(FLAGS_out));
  std::ofstream f(out);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot write ", out));
  f << j.dump(2) << "\n";
  std::printf("wrote %s\n", out.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace specserve::tools

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status st = specserve::tools::Run();
  if (!st.ok()) {
    std::fprintf(stderr, "cpu_bench: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
