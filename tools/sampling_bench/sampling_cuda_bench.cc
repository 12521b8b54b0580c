// sampling_cuda_bench: sampled decoding's last step on the GPU machine, the
// device's SampleRows (kernels/cuda/sample_rows.cu) beside what the worker
// did before it, in the same run: copy each row's logits to the host, then
// FilteredProbs + SampleIndex there (the Backend::SampleRows default).
// Per filter setting and rows per call (1, 8, 64: one per session of a
// batched step) at the Qwen3.5 vocabulary, median ms per call, the ratio,
// and the floor beside them: the call's logits bytes read once at the copy
// bandwidth measured here (the device kernels read each row 7-8 times, from
// L2 where it fits, and one block per row does the ordered filters' passes).
// Tokens of the two paths are compared as well (differences are expected
// only where a long sum's order moves a boundary).
//
//   sampling_cuda_bench [--vocab=248320] [--reps=20] [--json_out=FILE]
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/sampling/sampling.h"
#include "nlohmann/json.hpp"
#include "tools/bench_timing/bench_timing.h"

ABSL_FLAG(int, vocab, 248320, "columns per row of logits");
ABSL_FLAG(int, reps, 20, "timed repetitions per figure (median)");
ABSL_FLAG(std::string, json_out, "", "also write the table as JSON here");

namespace {

using specserve::bench::WallMs;
using specserve::kernels::Backend;
using specserve::kernels::DenseSampleRows;
using specserve::kernels::SampleRowsParams;
using specserve::sampling::SamplingConfig;

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int vocab = absl::GetFlag(FLAGS_vocab);
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  auto made = specserve::kernels::cuda::CreateCudaBackend(0);
  Check(made.status());
  Backend& gpu = **made;
  const int max_rows = 64;
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(max_rows) * vocab);
  for (float& x : logits) x = d(rng);
  const size_t bytes = logits.size() * sizeof(float);
  auto x = gpu.Allocate(bytes);
  Check(x.status());
  Check(gpu.CopyToDevice(x->data(), logits.data(), bytes));
  // Copy bandwidth of this run (device to device), for the floor.
  auto y = gpu.Allocate(bytes);
  Check(y.status());
  const double copy_ms = WallMs(2, reps, [&] {
    Check(gpu.CopyOnDevice(y->data(), x->data(), bytes));
    Check(gpu.Synchronize());
  });
  const double copy_gbs = 2.0 * bytes / (copy_ms * 1e6);

  const std::vector<SamplingConfig> configs = {
      {0.8f, 0, 1.0f, 0.0f},  {0.8f, 50, 0.95f, 0.0f}, {0.8f, 0, 0.9f, 0.0f},
      {2.0f, 0, 0.9f, 0.0f},  {0.8f, 0, 1.0f, 0.05f},  {1.0f, 20, 0.8f, 0.05f},
      {1.0f, 5000, 0.9f, 0.0f}};
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  nlohmann::json table = nlohmann::json::array();
  std::printf("copy bandwidth %.0f GB/s; vocab %d\n", copy_gbs, vocab);
  std::printf("%5s %5s %6s %5s %5s %10s %10s %8s %10s %8s\n", "rows", "temp", "top_k", "top_p",
              "min_p", "device_ms", "host_ms", "x faster", "floor_ms", "same tok");
  for (int rows : {1, 8, 64}) {
    for (const SamplingConfig& c : configs) {
      std::vector<SamplingConfig> cs(rows, c);
      std::vector<float> us(rows);
      for (float& u : us) u = uni(rng);
      std::vector<int32_t> dev(rows), host(rows);
      SampleRowsParams p =
          DenseSampleRows(rows, x->f32(), vocab, /*row_index=*/nullptr, cs.data());
      p.uniform = us.data();
      p.token = dev.data();
      const double device_ms = WallMs(2, reps, [&] { Check(gpu.SampleRows(p)); });
      // The host path: Backend::SampleRows' default, row by row.
      p.token = host.data();
      const int host_reps = rows >= 64 ? std::max(1, reps / 10) : reps;
      const double host_ms =
          WallMs(1, host_reps, [&] { Check(gpu.Backend::SampleRows(p)); });
      int same = 0;
      for (int r = 0; r < rows; ++r) same += dev[r] == host[r];
      const double floor_ms = rows * vocab * 4.0 / (copy_gbs * 1e6);
      std::printf("%5d %5.2f %6d %5.2f %5.2f %10.3f %10.3f %8.1f %10.4f %5d/%-3d\n", rows,
                  c.temperature, c.top_k, c.top_p, c.min_p, device_ms, host_ms,
                  host_ms / device_ms, floor_ms, same, rows);
      table.push_back({{"rows", rows},          {"temperature", c.temperature},
                       {"top_k", c.top_k},      {"top_p", c.top_p},
                       {"min_p", c.min_p},      {"device_ms", device_ms},
                       {"host_ms", host_ms},    {"floor_ms", floor_ms},
                       {"same_tokens", same},   {"copy_gbs", copy_gbs}});
    }
  }
  const std::string out = absl::GetFlag(FLAGS_json_out);
  if (!out.empty()) std::ofstream(out) << table.dump(2) << "\n";
  return 0;
}
