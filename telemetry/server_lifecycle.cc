#include "telemetry/server_lifecycle.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "glog/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace specserve::telemetry {
namespace {

// Written from the signal handler: only lock-free atomic stores happen there.
std::atomic<bool> g_drain_requested{false};
std::atomic<bool> g_shutdown_requested{false};

std::atomic<int> g_in_flight{0};

void OnSignal(int) {
  g_drain_requested.store(true);
  g_shutdown_requested.store(true);
}

}  // namespace

void EnableHealthAndReflection() {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
}

void InstallDrainSignalHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  // A client that disconnects mid-write must not kill the process.
  signal(SIGPIPE, SIG_IGN);
}

InFlightGuard::InFlightGuard() { g_in_flight.fetch_add(1); }
InFlightGuard::~InFlightGuard() { g_in_flight.fetch_sub(1); }
int InFlightCount() { return g_in_flight.load(); }

bool DrainRequested() { return g_drain_requested.load(); }

void RequestDrain() { g_drain_requested.store(true); }

void RequestShutdown() {
  g_drain_requested.store(true);
  g_shutdown_requested.store(true);
}

bool ShutdownRequested() { return g_shutdown_requested.load(); }

void ServeUntilDrained(grpc::Server* server,
                       const std::vector<std::string>& services,
                       absl::Duration grace,
                       const std::function<void()>& cut_off) {
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  CHECK(health != nullptr) << "EnableHealthAndReflection() was not called";
  health->SetServingStatus("", true);
  for (const std::string& s : services) health->SetServingStatus(s, true);

  // Polling keeps the signal handler trivial; 50 ms is far below any drain
  // latency anyone waits on.
  while (!DrainRequested()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  LOG(INFO) << "drain requested: health NOT_SERVING, refusing new work, "
            << "waiting up to " << absl::FormatDuration(grace)
            << " for in-flight RPCs";
  health->SetServingStatus("", false);
  for (const std::string& s : services) health->SetServingStatus(s, false);
  // The server keeps answering (health says NOT_SERVING, services refuse new
  // work) while in-flight streams finish.
  const absl::Time deadline = absl::Now() + grace;
  while (InFlightCount() > 0 && absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (InFlightCount() > 0) {
    LOG(WARNING) << InFlightCount() << " RPC(s) still running after the grace "
                 << "period; cutting them off";
    if (cut_off) cut_off();
  }
  if (!ShutdownRequested()) {
    LOG(INFO) << "drained: refusing new work until SIGTERM";
    while (!ShutdownRequested()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  // Shutdown(deadline) stops accepting RPCs and cancels whatever is still
  // running at the deadline.
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(200));
  LOG(INFO) << "server stopped";
}

}  // namespace specserve::telemetry
