// A small HTTP server for Prometheus scrapes and liveness probes, on its own
// port and threads (cpp-httplib), beside a process's gRPC server:
//   GET /metrics  200, text/plain; version=0.0.4, the body from `render`
//   GET /healthz  200 "ok" while `healthy` returns true, else 503 "draining"
// Anything else answers 404.
//
// Usage:
//   MetricsHttpServer http([&] { return metrics.RenderText(); },
//                          [&] { return !draining; });
//   SS_ASSIGN_OR_RETURN(int port, http.Start(flag_port));  // 0 = any free
//   ...
//   http.Stop();  // also done by the destructor
//
// Start binds synchronously (so a port clash is reported by Start, and the
// port is accepting connections when Start returns) and then serves on a
// background thread until Stop. `render` and `healthy` run on the server's
// worker threads, concurrently with the rest of the process: they must be
// thread-safe. `healthy` may be null (always healthy).
#ifndef SPECSERVE_TELEMETRY_METRICS_HTTP_H_
#define SPECSERVE_TELEMETRY_METRICS_HTTP_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace specserve::telemetry {

struct MetricsHttpOptions {
  // Interface to bind: "127.0.0.1" (local scrapes only) or "0.0.0.0".
  std::string host = "127.0.0.1";
  // Request-handling threads (cpp-httplib's default is one per core, at least
  // 8; a scrape endpoint needs few).
  int threads = 2;
};

class MetricsHttpServer {
 public:
  using RenderFn = std::function<std::string()>;
  using HealthFn = std::function<bool()>;

  MetricsHttpServer(RenderFn render, HealthFn healthy,
                    MetricsHttpOptions options = {});
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Binds `port` (0 = a free port) and starts serving. Returns the bound port,
  // or UNAVAILABLE when the address cannot be bound, FAILED_PRECONDITION when
  // already started.
  absl::StatusOr<int> Start(int port);
  // Stops accepting, finishes in-flight requests, joins the thread.
  // Idempotent; safe to call without Start.
  void Stop();
  // The bound port, 0 before Start.
  int port() const { return port_; }

 private:
  const RenderFn render_;
  const HealthFn healthy_;
  const MetricsHttpOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace specserve::telemetry

#endif  // SPECSERVE_TELEMETRY_METRICS_HTTP_H_
