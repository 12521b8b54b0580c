// specgen: loads a model directory and runs plain greedy generation on the
// CPU reference backend or a CUDA GPU (no server, no speculation).
//
//   specgen --model DIR --prompt-ids 5,17,42 --max-new N [--device cuda:0]
//     prints `ids: a,b,c` (the generated ids, comma-separated, one line) and
//     `prefill: ...` / `decode: ...` lines with tokens/s.
//   specgen --model DIR --prompt-ids ... --max-new 0 --dump-logits FILE
//     writes {"logits": [[...], ...]}: one row of vocab-size floats per
//     prompt position.
// --device cpu (default) or cuda:N; cuda:N needs a build with --config=cuda
// (otherwise it fails with a clear error). Flags may be spelled with dashes
// or underscores. Relative paths resolve
// against the workspace under `bazel run`.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "kernels/cpu/cpu_backend.h"
#ifdef SPECSERVE_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif
#include "telemetry/status_macros.h"
#include "worker/model/model.h"

ABSL_FLAG(std::string, model, "",
          "model directory (config.json + safetensors)");
ABSL_FLAG(std::string, prompt_ids, "", "prompt token ids, comma-separated");
ABSL_FLAG(int, max_new, 16, "tokens to generate");
ABSL_FLAG(std::string, dump_logits, "",
          "write every prompt position's logits as JSON to this file");
ABSL_FLAG(bool, ignore_eos, false, "keep generating past an EOS token");
ABSL_FLAG(int, threads, 0, "CPU threads (0 = one per core)");
ABSL_FLAG(std::string, device, "cpu",
          "compute backend: cpu, or cuda:N (GPU N; needs --config=cuda)");

namespace specserve::tools {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string ResolvePath(const std::string& path) {
  const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  if (path.empty() || path[0] == '/' || ws == nullptr) return path;
  return absl::StrCat(ws, "/", path);
}

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  for (absl::string_view part :
       absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t id;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad token id '", part, "'"));
    }
    ids.push_back(id);
  }
  return ids;
}

// The prompt as token ids. Today only --prompt-ids; a text prompt (through
// the tokenizer) is another source resolved here.
absl::StatusOr<std::vector<int32_t>> PromptIds() {
  SS_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                      ParseIds(absl::GetFlag(FLAGS_prompt_ids)));
  if (ids.empty()) return absl::InvalidArgumentError("--prompt-ids is empty");
  return ids;
}

// The backend named by --device.
absl::StatusOr<std::unique_ptr<kernels::Backend>> MakeBackend(
    const std::string& device) {
  if (device == "cpu") {
    return std::unique_ptr<kernels::Backend>(new kernels::cpu::CpuBackend(
        kernels::cpu::CpuBackendOptions{absl::GetFlag(FLAGS_threads)}));
  }
  absl::string_view index = device;
  int n = -1;
  if (!absl::ConsumePrefix(&index, "cuda:") || !absl::SimpleAtoi(index, &n) ||
      n < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device '", device, "': expected cpu or cuda:N (N >= 0)"));
  }
#ifdef SPECSERVE_WITH_CUDA
  return kernels::cuda::CreateCudaBackend(n);
#else
  return absl::UnimplementedError(
      absl::StrCat("--device ", device,
                   ": this specgen was built without CUDA; rebuild it with "
                   "`bazel build --config=cuda //tools/specgen`"));
#endif
}

absl::Status DumpLogits(const std::string& path, const model::ForwardResult& r,
                        int vocab) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr)
    return absl::NotFoundError(absl::StrCat("cannot write ", path));
  std::fputs("{\"logits\": [", f);
  for (int t = 0; t < r.rows; ++t) {
    std::fputs(t ? ",\n[" : "\n[", f);
    for (int i = 0; i < vocab; ++i) {
      std::fprintf(f, i ? ", %.9g" : "%.9g",
                   r.logits[static_cast<size_t>(t) * vocab + i]);
    }
    std::fputs("]", f);
  }
  std::fputs("\n]}\n", f);
  if (std::fclose(f) != 0)
    return absl::DataLossError(absl::StrCat("writing ", path));
  return absl::OkStatus();
}

absl::Status Run() {
  const std::string dir = ResolvePath(absl::GetFlag(FLAGS_model));
  if (dir.empty()) return absl::InvalidArgumentError("--model is required");
  const int max_new = absl::GetFlag(FLAGS_max_new);
  if (max_new < 0) return absl::InvalidArgumentError("--max-new must be >= 0");
  SS_ASSIGN_OR_RETURN(std::vector<int32_t> prompt, PromptIds());

  SS_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> backend,
                      MakeBackend(absl::GetFlag(FLAGS_device)));
  const auto t_load = Clock::now();
  SS_ASSIGN_OR_RETURN(auto model, model::Model::Load(dir, backend.get()));
  const auto t_loaded = Clock::now();
  const model::ModelConfig& c = model->config();
  SS_ASSIGN_OR_RETURN(
      auto state, model->NewState({.capacity = static_cast<int>(prompt.size()) +
                                               max_new + 1}));

  const std::string dump = absl::GetFlag(FLAGS_dump_logits);
  model::ForwardResult r;
  if (backend->name() != "cpu") {
    // Untimed warm-up on a throwaway state: a GPU loads its kernels on first
    // launch, which would otherwise be counted as prefill time.
    SS_ASSIGN_OR_RETURN(auto warm, model->NewState({.capacity = 2}));
    SS_RETURN_IF_ERROR(model->Prefill(warm.get(), {prompt[0]}, {}, &r));
    SS_RETURN_IF_ERROR(model->Decode(warm.get(), prompt[0], &r));
  }
  const auto t0 = Clock::now();
  SS_RETURN_IF_ERROR(
      model->Prefill(state.get(), prompt, {.all_rows = !dump.empty()}, &r));
  const auto t1 = Clock::now();
  if (!dump.empty())
    SS_RETURN_IF_ERROR(DumpLogits(ResolvePath(dump), r, c.vocab_size));

  std::vector<int32_t> generated;
  int decode_steps = 0;
  const auto is_eos = [&](int32_t t) {
    if (absl::GetFlag(FLAGS_ignore_eos)) return false;
    for (int e : c.eos_token_ids)
      if (e == t) return true;
    return false;
  };
  int32_t next = r.argmax.back();
  const auto t2 = Clock::now();
  while (static_cast<int>(generated.size()) < max_new) {
    generated.push_back(next);
    if (is_eos(next) || static_cast<int>(generated.size()) == max_new) break;
    SS_RETURN_IF_ERROR(model->Decode(state.get(), next, &r));
    ++decode_steps;
    next = r.argmax[0];
  }
  const auto t3 = Clock::now();

  std::printf("ids: %s\n", absl::StrJoin(generated, ",").c_str());
  const double prefill_s = Seconds(t0, t1), decode_s = Seconds(t2, t3);
  std::printf("device: %s\n", absl::GetFlag(FLAGS_device).c_str());
  std::printf("load: %.1f ms\n", 1e3 * Seconds(t_load, t_loaded));
  std::printf("prefill: %zu tokens in %.2f ms = %.1f tokens/s\n", prompt.size(),
              1e3 * prefill_s, prompt.size() / prefill_s);
  if (decode_steps > 0) {
    std::printf("decode: %d tokens in %.2f ms = %.1f tokens/s\n", decode_steps,
                1e3 * decode_s, decode_steps / decode_s);
  } else {
    std::printf("decode: 0 tokens\n");
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace specserve::tools

int main(int argc, char** argv) {
  // Accept --prompt-ids as well as --prompt_ids: absl flag names are
  // identifiers, the documented spelling has dashes.
  std::vector<std::string> args(argv, argv + argc);
  std::vector<char*> fixed;
  for (std::string& a : args) {
    if (a.rfind("--", 0) == 0) {
      const size_t end = std::min(a.find('='), a.size());
      for (size_t i = 2; i < end; ++i)
        if (a[i] == '-') a[i] = '_';
    }
    fixed.push_back(a.data());
  }
  absl::SetProgramUsageMessage(
      "specgen --model DIR --prompt-ids 5,17,42 --max-new N [--dump-logits "
      "FILE] [--device cpu|cuda:N]");
  absl::ParseCommandLine(static_cast<int>(fixed.size()), fixed.data());
  const absl::Status st = specserve::tools::Run();
  if (!st.ok()) {
    std::fprintf(stderr, "specgen: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
