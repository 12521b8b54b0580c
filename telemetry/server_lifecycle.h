// Process lifecycle shared by the scheduler and the worker: health status,
// reflection, the drain and the SIGTERM shutdown.
//
// Drain contract (docs/RELIABILITY.md row 15): once a drain is requested the
// process marks every health status NOT_SERVING, services refuse new work
// with UNAVAILABLE (they poll DrainRequested()), and in-flight RPCs get up
// to `grace` to finish; what still runs then is cut off. A drain alone
// (Admin.Drain) leaves the process up, refusing new work, so an operator can
// inspect it before stopping it; SIGTERM/SIGINT (or RequestShutdown) drains
// and then shuts the server down, and the process exits 0.
#ifndef SPECSERVE_TELEMETRY_SERVER_LIFECYCLE_H_
#define SPECSERVE_TELEMETRY_SERVER_LIFECYCLE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace specserve::telemetry {

// Call before building any server: turns on gRPC's built-in health service
// and the reflection plugin for every server built afterwards.
void EnableHealthAndReflection();

// Installs SIGTERM/SIGINT handlers that request a shutdown
// (async-signal-safe).
void InstallDrainSignalHandlers();

// Whether a drain was requested (signal, Drain RPC, RequestShutdown).
// Services refuse new work while true; it stays true.
bool DrainRequested();
// Stops taking new work; the process stays up (the Admin.Drain RPC).
void RequestDrain();
// Drains, then stops the server (what SIGTERM does).
void RequestShutdown();
bool ShutdownRequested();

// Counts a long-running RPC (a Generate or Burst stream) as in flight for
// the drain: ServeUntilDrained waits for the count to reach zero (up to the
// grace period) before shutting the server down, and keeps answering health
// checks (NOT_SERVING) meanwhile.
class InFlightGuard {
 public:
  InFlightGuard();
  ~InFlightGuard();
  InFlightGuard(const InFlightGuard&) = delete;
  InFlightGuard& operator=(const InFlightGuard&) = delete;
};
int InFlightCount();

// Marks `services` (fully-qualified names) and "" SERVING, blocks until a
// drain is requested, then marks them NOT_SERVING and waits up to `grace`
// for in-flight RPCs (InFlightGuard) to finish. If some still run then,
// calls `cut_off` (null: nothing), which should end them and return when
// they are over (the server still answers meanwhile). Then blocks until a
// shutdown is requested and shuts the server down, cancelling whatever
// still runs. Returns when the server has stopped.
void ServeUntilDrained(grpc::Server* server,
                       const std::vector<std::string>& services,
                       absl::Duration grace,
                       const std::function<void()>& cut_off = nullptr);

}  // namespace specserve::telemetry

#endif  // SPECSERVE_TELEMETRY_SERVER_LIFECYCLE_H_
