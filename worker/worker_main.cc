// specserve_worker: one process per GPU (or the CPU backend). Loads a model
// directory, serves specserve.worker.v1 to the scheduler, with health and
// reflection; SIGTERM drains.
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"
#include "telemetry/server_lifecycle.h"
#include "kernels/cpu/cpu_backend.h"
#include "worker/model/model.h"
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
ABSL_FLAG(int, threads, 0, "CPU backend threads (0 = one per core).");
ABSL_FLAG(int64_t, memory_budget_mb, 4096,
          "Device memory for session caches before idle sessions are "
          "offloaded to host memory.");
ABSL_FLAG(int64_t, host_budget_mb, 8192,
          "Host memory for offloaded sessions before the least recently used "
          "are dropped.");
ABSL_FLAG(std::string, step_costs, "",
          "Report these step costs instead of measuring them (deterministic "
          "spec-gate tests): 'decode=S1,S2,...;verify=S1,S2,...' in seconds, "
          "decode by batch size 1.., verify by columns 1..");
ABSL_FLAG(bool, enable_fault_injection, false,
          "Honour BurstRequest.inject_nan_at (tests only).");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "specserve_worker --model DIR --listen HOST:PORT --device cpu|cuda:N");
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);

  const std::string device = absl::GetFlag(FLAGS_device);
  if (device != "cpu" && !absl::StartsWith(device, "cuda:")) {
    LOG(ERROR) << "--device must be 'cpu' or 'cuda:N', got '" << device << "'";
    return 2;
  }
  if (device != "cpu") {
    LOG(ERROR) << "--device " << device
               << ": this build has no CUDA backend yet; use --device cpu";
    return 2;
  }

  specserve::kernels::cpu::CpuBackendOptions backend_options;
  backend_options.num_threads = absl::GetFlag(FLAGS_threads);
  specserve::kernels::cpu::CpuBackend backend(backend_options);
  auto model = specserve::model::Model::Load(absl::GetFlag(FLAGS_model),
                                             &backend);
  if (!model.ok()) {
    LOG(ERROR) << "cannot load model: " << model.status().message();
    return 1;
  }
  LOG(INFO) << "loaded " << (*model)->checkpoint().dir() << ": "
            << (*model)->checkpoint().parameter_count() << " parameters";

  specserve::telemetry::EnableHealthAndReflection();
  specserve::telemetry::InstallDrainSignalHandlers();

  specserve::worker::WorkerOptions options;
  options.device = device;
  options.default_capacity = absl::GetFlag(FLAGS_default_capacity);
  options.pool.device_budget_bytes =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_memory_budget_mb)) << 20;
  options.pool.host_budget_bytes =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_host_budget_mb)) << 20;
  options.enable_fault_injection = absl::GetFlag(FLAGS_enable_fault_injection);
  auto costs = absl::GetFlag(FLAGS_step_costs).empty()
                   ? specserve::worker::MeasureStepCosts(model->get(), 16, 8, 3)
                   : specserve::worker::ParseStepCosts(
                         absl::GetFlag(FLAGS_step_costs));
  if (!costs.ok()) {
    LOG(ERROR) << "cannot measure step costs: " << costs.status();
    return 1;
  }
  options.costs = *costs;
  specserve::worker::WorkerService service(options, model->get());

  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen),
                           grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    LOG(ERROR) << "cannot listen on " << absl::GetFlag(FLAGS_listen);
    return 1;
  }
  // Tests and tools/serve read this line to learn the port.
  std::printf("specserve_worker listening on port %d\n", port);
  std::fflush(stdout);

  specserve::telemetry::ServeUntilDrained(
      server.get(), {"specserve.worker.v1.Worker"},
      absl::Seconds(absl::GetFlag(FLAGS_drain_grace_seconds)));
  return 0;
}
