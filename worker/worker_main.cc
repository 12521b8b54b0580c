// specserve_worker: one process per GPU (or the CPU backend). Loads a model
// directory, serves specserve.worker.v1 to the scheduler, with health and
// reflection; SIGTERM drains.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/gated_delta_rule.h"
#include "telemetry/server_lifecycle.h"
#include "telemetry/status_macros.h"
#include "telemetry/tls_credentials.h"
#ifdef SPECSERVE_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif
#include "worker/model/model.h"
#include "worker/model_files/model_config.h"
#include "worker/request_limits.h"
#include "worker/restart.h"
#include "worker/step_costs.h"
#include "worker/worker_service.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50061",
          "Address to serve specserve.worker.v1 on (host:port; port 0 picks "
          "a free port, printed on stdout).");
ABSL_FLAG(std::string, model, "models/default",
          "Model directory: config.json + safetensors (+ tokenizer.json).");
ABSL_FLAG(std::string, device, "cpu", "Compute device: cpu or cuda:N.");
ABSL_FLAG(int, default_capacity, 4096,
          "Rows a session's caches hold when the scheduler asks for none.");
ABSL_FLAG(int, drain_grace_seconds, 30,
          "On SIGTERM: seconds in-flight bursts get to finish.");
ABSL_FLAG(bool, cuda_graphs, true,
          "On cuda:N, record each step shape once as a CUDA graph and replay "
          "it (results are bit-identical either way); the CPU runs op by op.");
ABSL_FLAG(int, threads, 0, "CPU backend threads (0 = one per core).");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "Element type of the attention KV caches: fp32, bf16 (half the "
          "bytes; keys and values rounded to nearest even), or auto (bf16 on "
          "cuda:N, fp32 on the CPU, the exactness oracle).");
ABSL_FLAG(std::string, recurrent_state_dtype, "auto",
          "Element type of the linear-attention layers' recurrent (gated "
          "delta rule) states: fp32, bf16 (half the bytes each decode step "
          "reads and writes; the state is rounded to nearest even after every "
          "token, so verify and decode stay bit-identical), or auto (the "
          "config.json's mamba_ssm_dtype: float32 or bfloat16; fp32 when it "
          "has none). The conv states stay fp32.");
ABSL_FLAG(int64_t, memory_budget_mb, -1,
          "Device memory for session caches before idle sessions are "
          "offloaded to host memory (0: offload every idle session). -1: on "
          "a GPU, 90% of the memory free once the weights are loaded, less "
          "2 GiB for workspaces and step graphs; on the CPU, 4096.");
ABSL_FLAG(int64_t, host_budget_mb, 8192,
          "Host memory for offloaded sessions before the least recently used "
          "are dropped.");
ABSL_FLAG(std::string, step_costs, "",
          "Report these step costs instead of measuring them (deterministic "
          "spec-gate tests): 'decode=S1,S2,...;verify=S1,S2,...' in seconds, "
          "decode by batch size 1.., verify by columns 1..");
ABSL_FLAG(int, prefix_checkpoint_interval, 1024,
          "While a prompt is prefilled, save its state at every multiple of "
          "this many tokens inside it (the --prefix_checkpoints nearest its "
          "end), so that a later request sharing only its beginning (a "
          "system prompt with another question) resumes there instead of "
          "prefilling it. A multiple of 64; 0: only at prompt ends and "
          "generation ends.");
ABSL_FLAG(int, prefix_checkpoints, 2,
          "Prefix checkpoints kept per session (each a copy of every linear "
          "layer's state).");
ABSL_FLAG(bool, enable_fault_injection, false,
          "Honour BurstRequest.inject_nan_at (tests only).");
ABSL_FLAG(int, session_lease_seconds, 60,
          "Release every idle session once no scheduler has called for this "
          "many seconds (0 = never), so a scheduler that exits leaves no "
          "caches behind. The scheduler's health poll renews the lease every "
          "--worker_poll_ms, as does every session call; keep it well above "
          "the scheduler's poll interval. Time the process is stopped "
          "(SIGSTOP) does not count.");

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of this worker: serve TLS only (with "
          "--tls_key; plaintext clients are refused). Empty = plaintext.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA: every client (the scheduler) must present a certificate "
          "it signed (mutual TLS). Needs --tls_cert.");
ABSL_FLAG(int32_t, json_whitespace, 64,
          "Structured JSON output may put at most this many whitespace "
          "characters in one place between tokens; 0: none but the fixed "
          "separators ', ' and ': ' (for models that loop on whitespace).");

namespace {

using specserve::kernels::DType;

// --recurrent_state_dtype: fp32 or bf16, or for auto the model's
// mamba_ssm_dtype (float32 or bfloat16; float16 is not a state type the
// kernels keep), fp32 when the config has none or cannot be read.
absl::StatusOr<DType> RecurrentStateDType(const std::string& model_dir) {
  SS_ASSIGN_OR_RETURN(
      const std::optional<DType> named,
      specserve::kernels::ParseCacheDTypeFlag(
          "recurrent_state_dtype", absl::GetFlag(FLAGS_recurrent_state_dtype)));
  if (named) return *named;
  auto config = specserve::model_files::LoadModelConfig(model_dir);
  // An unreadable config fails the model's load next, with its own message.
  if (!config.ok()) return DType::kF32;
  const std::string& ssm = config->mamba_ssm_dtype;
  if (ssm.empty() || ssm == "float32") return DType::kF32;
  if (ssm == "bfloat16") return DType::kBF16;
  return absl::InvalidArgumentError(absl::StrCat(
      "--recurrent_state_dtype=auto: ", model_dir,
      "/config.json has mamba_ssm_dtype '", ssm,
      "'; the recurrent state is fp32 or bf16 (float32 or bfloat16), pass "
      "--recurrent_state_dtype=fp32 or bf16"));
}

// The backend named by --device: cpu, or cuda:N in a --config=cuda build.
absl::StatusOr<std::unique_ptr<specserve::kernels::Backend>> MakeBackend(
    const std::string& device, const std::string& model_dir) {
  SS_ASSIGN_OR_RETURN(
      const std::optional<DType> kv_dtype,
      specserve::kernels::ParseCacheDTypeFlag(
          "kv_cache_dtype", absl::GetFlag(FLAGS_kv_cache_dtype)));
  auto rec_dtype = RecurrentStateDType(model_dir);
  if (!rec_dtype.ok()) return rec_dtype.status();
  if (device == "cpu") {
    specserve::kernels::cpu::CpuBackendOptions options;
    options.num_threads = absl::GetFlag(FLAGS_threads);
    if (kv_dtype) options.kv_cache_dtype = *kv_dtype;
    options.recurrent_state_dtype = *rec_dtype;
    return std::unique_ptr<specserve::kernels::Backend>(
        new specserve::kernels::cpu::CpuBackend(options));
  }
  absl::string_view index = device;
  int n = -1;
  if (!absl::ConsumePrefix(&index, "cuda:") || !absl::SimpleAtoi(index, &n) ||
      n < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device must be 'cpu' or 'cuda:N' (N >= 0), got '", device, "'"));
  }
#ifdef SPECSERVE_WITH_CUDA
  specserve::kernels::cuda::CudaBackendOptions options;
  options.device = n;
  options.kv_cache_dtype = kv_dtype.value_or(DType::kBF16);
  options.recurrent_state_dtype = *rec_dtype;
  return specserve::kernels::cuda::CreateCudaBackend(options);
#else
  return absl::UnimplementedError(absl::StrCat(
      "--device ", device,
      ": this specserve_worker was built without CUDA; rebuild it with "
      "`bazel build --config=cuda //worker:specserve_worker` or use "
      "--device cpu"));
#endif
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "specserve_worker --model DIR --listen HOST:PORT --device cpu|cuda:N");
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);

  // Before the model loads: a bad TLS flag fails at once.
  specserve::telemetry::ServerTlsFiles tls;
  tls.cert = absl::GetFlag(FLAGS_tls_cert);
  tls.key = absl::GetFlag(FLAGS_tls_key);
  tls.client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  auto credentials = specserve::telemetry::MakeServerCredentials(tls);
  if (!credentials.ok()) {
    LOG(ERROR) << credentials.status().message();
    return 2;
  }
  const std::string listen = absl::GetFlag(FLAGS_listen);
  if (!tls.enabled() &&
      !specserve::telemetry::IsLoopbackListenAddress(listen)) {
    LOG(WARNING) << "serving plaintext on " << listen
                 << ", which is not a loopback address: anyone who can "
                    "reach it can call this worker; give --tls_cert, "
                    "--tls_key and --tls_client_ca";
  } else if (tls.enabled() && tls.client_ca.empty()) {
    LOG(WARNING) << "TLS without --tls_client_ca: any client can call this "
                    "worker";
  }

  const std::string device = absl::GetFlag(FLAGS_device);
  auto backend = MakeBackend(device, absl::GetFlag(FLAGS_model));
  if (!backend.ok()) {
    LOG(ERROR) << backend.status().message();
    return 2;
  }
  LOG(INFO) << "device " << device << ": " << (*backend)->name()
            << " backend, KV cache "
            << specserve::kernels::DTypeName((*backend)->KvCacheDType())
            << ", recurrent state "
            << specserve::kernels::DTypeName((*backend)->RecurrentStateDType());
  // Declared before the model and the service: destroyed after them.
  std::unique_ptr<specserve::kernels::Backend> backend_owner =
      std::move(*backend);
  auto model = specserve::model::Model::Load(absl::GetFlag(FLAGS_model),
                                             backend_owner.get());
  if (!model.ok()) {
    LOG(ERROR) << "cannot load model: " << model.status().message();
    return 1;
  }
  (*model)->set_use_graphs(absl::GetFlag(FLAGS_cuda_graphs));
  LOG(INFO) << "loaded " << (*model)->checkpoint().dir() << ": "
            << (*model)->checkpoint().parameter_count() << " parameters";

  specserve::telemetry::EnableHealthAndReflection();
  specserve::telemetry::InstallDrainSignalHandlers();

  specserve::worker::WorkerOptions options;
  options.device = device;
  const int interval = absl::GetFlag(FLAGS_prefix_checkpoint_interval);
  if (interval < 0 ||
      interval % specserve::kernels::kPrefillDeltaRuleChunk != 0 ||
      absl::GetFlag(FLAGS_prefix_checkpoints) < 0) {
    LOG(ERROR) << "--prefix_checkpoint_interval must be 0 or a positive "
                  "multiple of "
               << specserve::kernels::kPrefillDeltaRuleChunk
               << " and --prefix_checkpoints >= 0 (got " << interval << ", "
               << absl::GetFlag(FLAGS_prefix_checkpoints) << ")";
    return 1;
  }
  options.prefix_checkpoints.interval = interval;
  options.prefix_checkpoints.keep = absl::GetFlag(FLAGS_prefix_checkpoints);
  options.default_capacity = absl::GetFlag(FLAGS_default_capacity);
  const int64_t budget_mb = absl::GetFlag(FLAGS_memory_budget_mb);
  options.pool.device_budget_bytes =
      static_cast<uint64_t>(std::max<int64_t>(budget_mb, 0)) << 20;
  if (budget_mb < 0) {
    constexpr uint64_t kReserve = uint64_t{2} << 30;
    absl::StatusOr<uint64_t> free_bytes = backend_owner->FreeDeviceBytes();
    options.pool.device_budget_bytes =
        free_bytes.ok()
            ? (*free_bytes > kReserve ? (*free_bytes - kReserve) / 10 * 9
                                      : *free_bytes / 2)
            : uint64_t{4096} << 20;
  }
  LOG(INFO) << "session memory budget: "
            << (options.pool.device_budget_bytes >> 20) << " MiB on " << device;
  options.pool.host_budget_bytes =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_host_budget_mb)) << 20;
  options.enable_fault_injection = absl::GetFlag(FLAGS_enable_fault_injection);
  if (absl::GetFlag(FLAGS_session_lease_seconds) < 0) {
    LOG(ERROR) << "--session_lease_seconds must be >= 0";
    return 2;
  }
  options.session_lease =
      absl::Seconds(absl::GetFlag(FLAGS_session_lease_seconds));
  auto costs =
      absl::GetFlag(FLAGS_step_costs).empty()
          ? specserve::worker::MeasureStepCosts(model->get(), 16, 8, 3)
          : specserve::worker::ParseStepCosts(absl::GetFlag(FLAGS_step_costs));
  if (!costs.ok()) {
    LOG(ERROR) << "cannot measure step costs: " << costs.status();
    return 1;
  }
  options.costs = *costs;
  options.live_costs = absl::GetFlag(FLAGS_step_costs).empty();
  // Worker.LoadModel: drain and shut down, then restart this process on the
  // new model.
  absl::Mutex reload_mu;
  std::string reload_dir;
  options.on_load_model = [&](const std::string& dir) {
    {
      absl::MutexLock lock(&reload_mu);
      reload_dir = dir;
    }
    specserve::telemetry::RequestShutdown();
  };
  // Structured output needs the model's tokenizer.json; without one the
  // worker serves everything else.
  specserve::grammar::GrammarCompilerOptions grammar_options;
  grammar_options.json_whitespace =
      std::max(0, absl::GetFlag(FLAGS_json_whitespace));
  auto grammars = specserve::grammar::GrammarCompiler::FromModelDir(
      absl::GetFlag(FLAGS_model), grammar_options);
  if (grammars.ok()) {
    options.grammars = std::move(*grammars);
  } else {
    LOG(WARNING) << "structured output is off: " << grammars.status();
  }
  specserve::worker::WorkerService service(options, model->get());

  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, *credentials, &port);
  // Room for an Admit of a whole context of history, and no more
  // (worker/request_limits.h).
  builder.SetMaxReceiveMessageSize(specserve::worker::MaxWorkerRequestBytes(
      (*model)->config().max_position_embeddings));
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    LOG(ERROR) << "cannot listen on " << listen
               << (tls.enabled() ? " (with TLS: does --tls_key belong to "
                                   "--tls_cert?)"
                                 : "");
    return 1;
  }
  // Tests and tools/serve read this line to learn the port.
  std::printf("specserve_worker listening on port %d\n", port);
  std::fflush(stdout);

  specserve::telemetry::ServeUntilDrained(
      server.get(), {"specserve.worker.v1.Worker"},
      absl::Seconds(absl::GetFlag(FLAGS_drain_grace_seconds)));
  // Bursts cut off at the end of the grace period stop at their next emit
  // (the call is cancelled) but run on their own threads over the service,
  // pool and model destroyed below: wait for them; past the bound, exit
  // without destructors rather than free what they use.
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (specserve::telemetry::InFlightCount() > 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  std::string restart_on;
  {
    absl::MutexLock lock(&reload_mu);
    restart_on = reload_dir;
  }
  if (!restart_on.empty()) {
    // Same port even when --listen asked for port 0, so the scheduler
    // finds the worker again. The kernel frees this process's memory
    // (device memory included) at exec.
    const std::string listen_flag = absl::GetFlag(FLAGS_listen);
    const std::string host = listen_flag.substr(0, listen_flag.rfind(':'));
    const std::vector<std::string> args = specserve::worker::RestartArgs(
        std::vector<std::string>(argv, argv + argc), restart_on,
        absl::StrCat(host, ":", port));
    LOG(INFO) << "restarting on model " << restart_on;
    server.reset();
#ifdef SPECSERVE_WITH_CUDA
    // Free the GPU now rather than trust the exec to: the service, the
    // sessions and the model are never used again.
    if (device.rfind("cuda:", 0) == 0) {
      int n = 0;
      if (absl::SimpleAtoi(device.substr(5), &n))
        specserve::kernels::cuda::ResetCudaDevice(n);
    }
#endif
    const absl::Status s = specserve::worker::ExecSelf(args);
    LOG(ERROR) << s.message();
    return 1;
  }
  if (specserve::telemetry::InFlightCount() > 0) {
    LOG(WARNING) << specserve::telemetry::InFlightCount()
                 << " burst(s) did not stop; exiting without cleanup";
    std::fflush(nullptr);
    std::_Exit(0);
  }
  return 0;
}
