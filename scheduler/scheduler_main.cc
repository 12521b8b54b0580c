// specserve_scheduler: the public specserve.v1 API. Connects to the workers it
// is given, watches their health, and (as the issues land) owns sessions,
// admission, the spec gate and the tokenizer. Health and reflection on; SIGTERM
// drains.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"
#include "scheduler/admin_service.h"
#include "scheduler/public_services.h"
#include "scheduler/worker_pool.h"
#include "telemetry/server_lifecycle.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "Address to serve specserve.v1 on (host:port; port 0 picks a free "
          "port, printed on stdout).");
ABSL_FLAG(std::string, workers, "127.0.0.1:50061",
          "Comma-separated worker addresses (host:port).");
ABSL_FLAG(std::string, model, "models/default",
          "Model directory (the scheduler reads tokenizer.json from it).");
ABSL_FLAG(int, worker_poll_ms, 500,
          "How often worker health is polled, in milliseconds.");
ABSL_FLAG(int, drain_grace_seconds, 30,
          "On SIGTERM: seconds in-flight requests get to finish.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "specserve_scheduler --listen HOST:PORT --workers HOST:PORT[,...] "
      "--model DIR");
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);

  std::vector<std::string> addresses =
      absl::StrSplit(absl::GetFlag(FLAGS_workers), ',', absl::SkipEmpty());
  if (addresses.empty()) {
    LOG(ERROR) << "--workers: give at least one worker address";
    return 2;
  }
  specserve::scheduler::WorkerPoolOptions pool_options;
  pool_options.poll_interval =
      absl::Milliseconds(absl::GetFlag(FLAGS_worker_poll_ms));
  specserve::scheduler::WorkerPool pool(addresses, pool_options);

  specserve::telemetry::EnableHealthAndReflection();
  specserve::telemetry::InstallDrainSignalHandlers();

  specserve::scheduler::AdminService admin(&pool);
  specserve::scheduler::GenerationService generation;
  specserve::scheduler::SessionsService sessions;
  specserve::scheduler::TokenizationService tokenization;

  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen),
                           grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&admin);
  builder.RegisterService(&generation);
  builder.RegisterService(&sessions);
  builder.RegisterService(&tokenization);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    LOG(ERROR) << "cannot listen on " << absl::GetFlag(FLAGS_listen);
    return 1;
  }
  std::printf("specserve_scheduler listening on port %d\n", port);
  std::fflush(stdout);

  specserve::telemetry::ServeUntilDrained(
      server.get(),
      {"specserve.v1.Generation", "specserve.v1.Sessions",
       "specserve.v1.Tokenization", "specserve.v1.Admin"},
      absl::Seconds(absl::GetFlag(FLAGS_drain_grace_seconds)));
  return 0;
}
