// Process lifecycle shared by the scheduler and the worker: health status,
// reflection, and the SIGTERM drain.
//
// Drain contract (docs/RELIABILITY.md row 15): on SIGTERM/SIGINT the process
// marks every health status NOT_SERVING, services refuse new work with
// UNAVAILABLE (they poll draining()), in-flight RPCs get up to `grace` to
// finish, then the server shuts down and the process exits 0.
#ifndef SPECSERVE_TELEMETRY_SERVER_LIFECYCLE_H_
#define SPECSERVE_TELEMETRY_SERVER_LIFECYCLE_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace specserve::telemetry {

// Call before building any server: turns on gRPC's built-in health service
// and the reflection plugin for every server built afterwards.
void EnableHealthAndReflection();

// Installs SIGTERM/SIGINT handlers that request a drain (async-signal-safe).
void InstallDrainSignalHandlers();

// Whether a drain was requested (signal or Drain RPC). Services refuse new
// work while true.
bool DrainRequested();
// Requests a drain programmatically (e.g. the Admin.Drain RPC).
void RequestDrain();

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
// drain is requested, then marks them NOT_SERVING, waits up to `grace` for in-flight
// RPCs (InFlightGuard) to finish and shuts the server down. Returns when the server has stopped.
void ServeUntilDrained(grpc::Server* server,
                       const std::vector<std::string>& services,
                       absl::Duration grace);

}  // namespace specserve::telemetry

#endif  // SPECSERVE_TELEMETRY_SERVER_LIFECYCLE_H_
