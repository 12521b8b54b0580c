// specgen: loads a model directory and generates on the CPU reference backend
// or a CUDA GPU (no server): plain greedy decode, or the speculative engine
// (worker/spec/spec_engine.h) with the model's MTP head, greedy or sampled,
// one prompt or a multi-turn script on one session.
//
//   specgen --model DIR --prompt-ids 5,17,42 --max-new N [--device cuda:0]
//     prints `ids: a,b,c` (the generated ids, comma-separated, one line) and
//     `prefill: ...` / `decode: ...` lines with tokens/s.
//   specgen --model DIR --prompt-ids ... --max-new 0 --dump-logits FILE
//     writes {"logits": [[...], ...]}: one row of vocab-size floats per
//     prompt position.
//   --prompt TEXT instead of --prompt-ids: tokenized with DIR/tokenizer.json
//     (printed as `prompt_ids:`); `text: "..."` (a JSON string) holds the
//     decoded continuation.
//   --spec-k K (K >= 1): speculative rounds of draft depth K in bursts of
//     --burst tokens; also prints
//       rounds: N                          verify rounds run
//       mean_accepted_per_round: X         tokens per round, bonus included
//       mean_accepted_drafts_per_round: Y  accepted drafts per round (= X - 1)
//       accept_rate_per_position: p1,...   accepted/drafted at draft position i
//   --temperature T [--top-p P --top-k K --min-p M --seed S]: sampled
//     (Philox stream S; the same seed gives the same ids).
//   --script FILE: a multi-turn JSON script on one session (see script.h);
//     prints `turn N ids:` / `turn N text:` lines and `ids:` = all turns'.
//   --compare-plain: also runs plain greedy decode on the same history and
//     prints `plain_equal: true|false` (token for token, every emitted token,
//     overshoot included).
// Generation stops at the model's EOS ids unless --ignore-eos. `ids:` holds at
// most --max-new tokens; a speculative round may emit more (`emitted:`).
// --device cpu (default) or cuda:N; cuda:N needs a build with --config=cuda
// (otherwise it fails with a clear error). Flags may be spelled with dashes
// or underscores. Relative paths resolve against the workspace under
// `bazel run`.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "kernels/cpu/cpu_backend.h"
#ifdef SPECSERVE_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif
#include "nlohmann/json.hpp"
#include "scheduler/tokenizer/tokenizer.h"
#include "telemetry/status_macros.h"
#include "tools/specgen/script.h"
#include "tools/specgen/spec_runner.h"
#include "worker/model/model.h"

ABSL_FLAG(std::string, model, "",
          "model directory (config.json + safetensors)");
ABSL_FLAG(std::string, prompt_ids, "", "prompt token ids, comma-separated");
ABSL_FLAG(std::string, prompt, "",
          "prompt text (tokenized with the model directory's tokenizer.json)");
ABSL_FLAG(int, max_new, 16, "tokens to generate (per turn with --script)");
ABSL_FLAG(std::string, dump_logits, "",
          "write every prompt position's logits as JSON to this file");
ABSL_FLAG(bool, ignore_eos, false, "keep generating past an EOS token");
ABSL_FLAG(int, threads, 0, "CPU threads (0 = one per core)");
ABSL_FLAG(std::string, device, "cpu",
          "compute backend: cpu, or cuda:N (GPU N; needs --config=cuda)");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "attention KV cache type: fp32, bf16 or auto (bf16 on cuda:N, fp32 "
          "on the CPU), as specserve_worker's flag");
ABSL_FLAG(int, spec_k, 0,
          "draft depth of speculative rounds (0 = plain decode)");
ABSL_FLAG(int, burst, 32, "tokens per burst on the engine path (0 = one)");
ABSL_FLAG(double, temperature, 0.0, "sampling temperature (0 = greedy)");
ABSL_FLAG(double, top_p, 1.0, "nucleus filter in (0, 1] (1 = off)");
ABSL_FLAG(int, top_k, 0, "keep the K most likely tokens (0 = off)");
ABSL_FLAG(double, min_p, 0.0, "min-p filter in [0, 1) (0 = off)");
ABSL_FLAG(uint64_t, seed, 0, "Philox seed of sampled generation");
ABSL_FLAG(std::string, script, "",
          "JSON list of turns run on one session (see tools/specgen/script.h)");
ABSL_FLAG(bool, compare_plain, false,
          "also run plain greedy and print plain_equal: true|false");
ABSL_FLAG(int, capacity, 0,
          "session rows on the engine path (0 = enough for every turn)");

namespace specserve::tools {
namespace {

using Clock = std::chrono::steady_clock;
using specgen::Turn;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string ResolvePath(const std::string& path) {
  const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  if (path.empty() || path[0] == '/' || ws == nullptr) return path;
  return absl::StrCat(ws, "/", path);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
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

// The tokenizer of the model directory, loaded on first use.
class LazyTokenizer {
 public:
  explicit LazyTokenizer(std::string dir) : dir_(std::move(dir)) {}
  absl::StatusOr<const tokenizer::Tokenizer*> Get() {
    if (tok_ == nullptr) {
      SS_ASSIGN_OR_RETURN(tok_, tokenizer::Tokenizer::Load(
                                    absl::StrCat(dir_, "/tokenizer.json")));
    }
    return tok_.get();
  }
  bool loaded() const { return tok_ != nullptr; }
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text) {
    SS_ASSIGN_OR_RETURN(const tokenizer::Tokenizer* tok, Get());
    const std::vector<uint32_t> ids = tok->Encode(text);
    return std::vector<int32_t>(ids.begin(), ids.end());
  }
  // The text as a one-line JSON string.
  absl::StatusOr<std::string> DecodeJson(const std::vector<int32_t>& ids) {
    SS_ASSIGN_OR_RETURN(const tokenizer::Tokenizer* tok, Get());
    SS_ASSIGN_OR_RETURN(std::string text, tok->Decode(std::vector<uint32_t>(
                                              ids.begin(), ids.end())));
    return nlohmann::json(text).dump(-1, ' ', false,
                                     nlohmann::json::error_handler_t::replace);
  }

 private:
  std::string dir_;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
};

// The turns to run: --script, or one turn from --prompt / --prompt-ids.
absl::StatusOr<std::vector<Turn>> BuildTurns(LazyTokenizer* tok) {
  const int max_new = absl::GetFlag(FLAGS_max_new);
  const std::string text = absl::GetFlag(FLAGS_prompt);
  const std::string ids = absl::GetFlag(FLAGS_prompt_ids);
  const std::string script = absl::GetFlag(FLAGS_script);
  if (!script.empty()) {
    if (!text.empty() || !ids.empty())
      return absl::InvalidArgumentError(
          "--script brings its own prompts: drop --prompt / --prompt-ids");
    SS_ASSIGN_OR_RETURN(std::string json, ReadFile(ResolvePath(script)));
    SS_ASSIGN_OR_RETURN(std::vector<specgen::ScriptTurn> parsed,
                        specgen::ParseScript(json));
    std::vector<Turn> turns;
    for (const specgen::ScriptTurn& st : parsed) {
      Turn t;
      if (st.text) {
        SS_ASSIGN_OR_RETURN(t.prompt, tok->Encode(*st.text));
      } else {
        t.prompt = st.ids;
      }
      t.max_new = st.max_new.value_or(max_new);
      t.rewind = st.rewind;
      turns.push_back(std::move(t));
    }
    return turns;
  }
  if (!text.empty() && !ids.empty())
    return absl::InvalidArgumentError(
        "give --prompt or --prompt-ids, not both");
  Turn t;
  t.max_new = max_new;
  if (!text.empty()) {
    SS_ASSIGN_OR_RETURN(t.prompt, tok->Encode(text));
    if (t.prompt.empty())
      return absl::InvalidArgumentError("--prompt encodes to no tokens");
  } else {
    SS_ASSIGN_OR_RETURN(t.prompt, ParseIds(ids));
    if (t.prompt.empty())
      return absl::InvalidArgumentError(
          "--prompt-ids is empty (or give --prompt TEXT)");
  }
  return std::vector<Turn>{std::move(t)};
}

// The backend named by --device.
absl::StatusOr<std::unique_ptr<kernels::Backend>> MakeBackend(
    const std::string& device) {
  SS_ASSIGN_OR_RETURN(
      const std::optional<kernels::DType> kv_dtype,
      kernels::ParseCacheDTypeFlag("kv_cache_dtype",
                                   absl::GetFlag(FLAGS_kv_cache_dtype)));
  if (device == "cpu") {
    kernels::cpu::CpuBackendOptions options;
    options.num_threads = absl::GetFlag(FLAGS_threads);
    if (kv_dtype) options.kv_cache_dtype = *kv_dtype;
    return std::unique_ptr<kernels::Backend>(
        new kernels::cpu::CpuBackend(options));
  }
  absl::string_view index = device;
  int n = -1;
  if (!absl::ConsumePrefix(&index, "cuda:") || !absl::SimpleAtoi(index, &n) ||
      n < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device '", device, "': expected cpu or cuda:N (N >= 0)"));
  }
#ifdef SPECSERVE_WITH_CUDA
  kernels::cuda::CudaBackendOptions options;
  options.device = n;
  options.kv_cache_dtype = kv_dtype.value_or(kernels::DType::kBF16);
  return kernels::cuda::CreateCudaBackend(options);
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

std::vector<int32_t> StopIds(const model::ModelConfig& c) {
  if (absl::GetFlag(FLAGS_ignore_eos)) return {};
  return std::vector<int32_t>(c.eos_token_ids.begin(), c.eos_token_ids.end());
}

void PrintTiming(const char* what, size_t tokens, double s) {
  if (tokens == 0) {
    std::printf("%s: 0 tokens\n", what);
    return;
  }
  std::printf("%s: %zu tokens in %.2f ms = %.1f tokens/s\n", what, tokens,
              1e3 * s, tokens / s);
}

// Plain greedy decode straight on the model (the original specgen path).
absl::Status RunPlain(model::Model* model, const Turn& turn, LazyTokenizer* tok,
                      double load_s) {
  const model::ModelConfig& c = model->config();
  const std::vector<int32_t>& prompt = turn.prompt;
  const int max_new = turn.max_new;
  SS_ASSIGN_OR_RETURN(
      auto state, model->NewState({.capacity = static_cast<int>(prompt.size()) +
                                               max_new + 1}));
  const std::string dump = absl::GetFlag(FLAGS_dump_logits);
  model::ForwardResult r;
  const auto t0 = Clock::now();
  SS_RETURN_IF_ERROR(
      model->Prefill(state.get(), prompt, {.all_rows = !dump.empty()}, &r));
  const auto t1 = Clock::now();
  if (!dump.empty())
    SS_RETURN_IF_ERROR(DumpLogits(ResolvePath(dump), r, c.vocab_size));

  std::vector<int32_t> generated;
  int decode_steps = 0;
  const std::vector<int32_t> stop = StopIds(c);
  const auto is_eos = [&](int32_t t) {
    return std::find(stop.begin(), stop.end(), t) != stop.end();
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
  if (tok->loaded()) {
    SS_ASSIGN_OR_RETURN(std::string text, tok->DecodeJson(generated));
    std::printf("text: %s\n", text.c_str());
  }
  std::printf("device: %s\n", absl::GetFlag(FLAGS_device).c_str());
  std::printf("load: %.1f ms\n", 1e3 * load_s);
  PrintTiming("prefill", prompt.size(), Seconds(t0, t1));
  PrintTiming("decode", decode_steps, Seconds(t2, t3));
  return absl::OkStatus();
}

std::string Rates(const telemetry::SpecTelemetry& t) {
  std::vector<std::string> rates;
  for (size_t i = 0; i < t.drafted_per_position.size(); ++i) {
    const double d = t.drafted_per_position[i];
    rates.push_back(
        absl::StrFormat("%.3f", d == 0 ? 0.0 : t.accepted_per_position[i] / d));
  }
  return absl::StrJoin(rates, ",");
}

// The speculative engine path: one session, every turn in bursts.
absl::Status RunEngine(model::Model* model, const std::vector<Turn>& turns,
                       LazyTokenizer* tok, double load_s) {
  specgen::SpecRunOptions o;
  o.k = absl::GetFlag(FLAGS_spec_k);
  o.burst = absl::GetFlag(FLAGS_burst);
  o.sampling.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  o.sampling.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  o.sampling.top_k = absl::GetFlag(FLAGS_top_k);
  o.sampling.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p));
  o.seed = absl::GetFlag(FLAGS_seed);
  o.stop_ids = StopIds(model->config());
  o.capacity = absl::GetFlag(FLAGS_capacity);
  SS_RETURN_IF_ERROR(sampling::ValidateSamplingConfig(o.sampling));
  SS_ASSIGN_OR_RETURN(specgen::SpecRun run, specgen::RunTurns(model, turns, o));

  const bool script = turns.size() > 1 || !absl::GetFlag(FLAGS_script).empty();
  std::vector<int32_t> all_ids;
  size_t emitted = 0;
  double decode_s = 0;
  for (size_t i = 0; i < run.turns.size(); ++i) {
    const specgen::TurnResult& t = run.turns[i];
    all_ids.insert(all_ids.end(), t.ids.begin(), t.ids.end());
    emitted += t.emitted.size();
    decode_s += t.seconds;
    if (!script) continue;
    std::printf("turn %zu ids: %s\n", i + 1, absl::StrJoin(t.ids, ",").c_str());
    if (tok->loaded()) {
      SS_ASSIGN_OR_RETURN(std::string text, tok->DecodeJson(t.ids));
      std::printf("turn %zu text: %s\n", i + 1, text.c_str());
    }
    std::printf("turn %zu end: %s, emitted %zu, cached %d, rounds %llu\n",
                i + 1, specgen::BurstEndName(t.end), t.emitted.size(),
                t.cached_tokens,
                static_cast<unsigned long long>(t.telemetry.rounds));
  }
  std::printf("ids: %s\n", absl::StrJoin(all_ids, ",").c_str());
  if (tok->loaded() && !script) {
    SS_ASSIGN_OR_RETURN(std::string text, tok->DecodeJson(all_ids));
    std::printf("text: %s\n", text.c_str());
  }
  if (!script)
    std::printf("end: %s\n", specgen::BurstEndName(run.turns[0].end));
  std::printf("emitted: %zu\n", emitted);
  int bursts = 0;
  for (const auto& t : run.turns) bursts += t.bursts;
  std::printf("bursts: %d\n", bursts);
  if (o.k > 0) {
    const telemetry::SpecTelemetry& tel = run.telemetry;
    std::printf("spec_k: %d\n", o.k);
    std::printf("rounds: %llu\n", static_cast<unsigned long long>(tel.rounds));
    std::printf("drafted: %llu\naccepted: %llu\n",
                static_cast<unsigned long long>(tel.drafted),
                static_cast<unsigned long long>(tel.accepted));
    std::printf("mean_accepted_per_round: %.3f\n", tel.MeanTokensPerRound());
    std::printf(
        "mean_accepted_drafts_per_round: %.3f\n",
        tel.rounds == 0 ? 0.0 : static_cast<double>(tel.accepted) / tel.rounds);
    std::printf("accept_rate_per_position: %s\n", Rates(tel).c_str());
  }
  if (absl::GetFlag(FLAGS_compare_plain)) {
    if (!o.sampling.greedy()) {
      std::printf(
          "plain_equal: n/a (sampled: equal to plain in distribution only)\n");
    } else {
      SS_ASSIGN_OR_RETURN(auto plain,
                          specgen::PlainGreedyTurns(model, turns, run));
      bool equal = true;
      for (size_t i = 0; i < run.turns.size() && equal; ++i) {
        if (plain[i] == run.turns[i].emitted) continue;
        equal = false;
        std::printf("plain_ids (turn %zu): %s\n", i + 1,
                    absl::StrJoin(plain[i], ",").c_str());
        std::printf("spec_ids (turn %zu): %s\n", i + 1,
                    absl::StrJoin(run.turns[i].emitted, ",").c_str());
      }
      std::printf("plain_equal: %s\n", equal ? "true" : "false");
    }
  }
  std::printf("device: %s\n", absl::GetFlag(FLAGS_device).c_str());
  std::printf("load: %.1f ms\n", 1e3 * load_s);
  PrintTiming("prefill", run.prefill_tokens, run.prefill_seconds);
  PrintTiming("decode", emitted, decode_s);
  return absl::OkStatus();
}

absl::Status Run() {
  const std::string dir = ResolvePath(absl::GetFlag(FLAGS_model));
  if (dir.empty()) return absl::InvalidArgumentError("--model is required");
  if (absl::GetFlag(FLAGS_max_new) < 0)
    return absl::InvalidArgumentError("--max-new must be >= 0");
  if (absl::GetFlag(FLAGS_spec_k) < 0)
    return absl::InvalidArgumentError("--spec-k must be >= 0");
  LazyTokenizer tok(dir);
  SS_ASSIGN_OR_RETURN(std::vector<Turn> turns, BuildTurns(&tok));
  if (!absl::GetFlag(FLAGS_prompt).empty()) {
    std::printf("prompt_ids: %s\n",
                absl::StrJoin(turns[0].prompt, ",").c_str());
  }
  const bool engine = !absl::GetFlag(FLAGS_script).empty() ||
                      absl::GetFlag(FLAGS_spec_k) > 0 ||
                      absl::GetFlag(FLAGS_temperature) != 0.0 ||
                      absl::GetFlag(FLAGS_compare_plain);
  if (engine && !absl::GetFlag(FLAGS_dump_logits).empty())
    return absl::InvalidArgumentError(
        "--dump-logits runs plain greedy only (no --spec-k, --temperature, "
        "--script, --compare-plain)");

  SS_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> backend,
                      MakeBackend(absl::GetFlag(FLAGS_device)));
  const auto t_load = Clock::now();
  SS_ASSIGN_OR_RETURN(auto model, model::Model::Load(dir, backend.get()));
  const auto t_loaded = Clock::now();
  if (backend->name() != "cpu") {
    // Untimed warm-up on a throwaway state: a GPU loads its kernels on first
    // launch, which would otherwise be counted as prefill time.
    const int32_t t0 = turns[0].prompt[0];
    model::ForwardResult r;
    SS_ASSIGN_OR_RETURN(auto warm, model->NewState({.capacity = 2}));
    SS_RETURN_IF_ERROR(model->Prefill(warm.get(), {t0}, {}, &r));
    SS_RETURN_IF_ERROR(model->Decode(warm.get(), t0, &r));
  }
  const double load_s = Seconds(t_load, t_loaded);
  if (engine) return RunEngine(model.get(), turns, &tok, load_s);
  return RunPlain(model.get(), turns[0], &tok, load_s);
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
      "specgen --model DIR (--prompt-ids 5,17,42 | --prompt TEXT | --script "
      "FILE) --max-new N [--spec-k K] [--temperature T --top-p P --top-k K "
      "--seed S] [--burst N] [--compare-plain] [--ignore-eos] [--dump-logits "
      "FILE] [--device cpu|cuda:N]");
  absl::ParseCommandLine(static_cast<int>(fixed.size()), fixed.data());
  const absl::Status st = specserve::tools::Run();
  if (!st.ok()) {
    std::fprintf(stderr, "specgen: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
