#include "telemetry/metrics_http.h"

#include <sys/socket.h>

#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "httplib.h"

namespace specserve::telemetry {

MetricsHttpServer::MetricsHttpServer(RenderFn render, HealthFn healthy,
                                     MetricsHttpOptions options)
    : render_(std::move(render)),
      healthy_(std::move(healthy)),
      options_(std::move(options)) {
  CHECK(render_ != nullptr) << "MetricsHttpServer needs a render function";
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

absl::StatusOr<int> MetricsHttpServer::Start(int port) {
  if (server_ != nullptr) {
    return absl::FailedPreconditionError("metrics HTTP server already started");
  }
  auto server = std::make_unique<httplib::Server>();
  const int threads = options_.threads > 0 ? options_.threads : 1;
  server->new_task_queue = [threads] {
    return new httplib::ThreadPool(static_cast<size_t>(threads));
  };
  // httplib's default sets SO_REUSEPORT, which lets a second process bind the
  // same port and silently take half the scrapes. SO_REUSEADDR alone still
  // allows a quick restart (TIME_WAIT) but makes a port clash an error.
  server->set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server->Get("/metrics",
              [this](const httplib::Request&, httplib::Response& res) {
                res.set_content(render_(), "text/plain; version=0.0.4");
              });
  server->Get("/healthz",
              [this](const httplib::Request&, httplib::Response& res) {
                const bool ok = healthy_ == nullptr || healthy_();
                res.status = ok ? 200 : 503;
                res.set_content(ok ? "ok\n" : "draining\n", "text/plain");
              });

  int bound = 0;
  if (port == 0) {
    bound = server->bind_to_any_port(options_.host);
    if (bound <= 0) bound = 0;
  } else if (server->bind_to_port(options_.host, port)) {
    bound = port;
  }
  if (bound == 0) {
    return absl::UnavailableError(
        absl::StrCat("metrics HTTP: cannot bind ", options_.host, ":", port,
                     " (port in use or address not available)"));
  }
  httplib::Server* raw = server.get();
  server_ = std::move(server);
  port_ = bound;
  thread_ = std::thread([raw] { raw->listen_after_bind(); });
  // httplib's stop() is a no-op until the accept loop has started, so a Stop
  // right after Start would leave the thread blocked: wait for the loop. (The
  // socket already listens, so no connection is refused meanwhile.)
  for (int i = 0; i < 5000 && !raw->is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!raw->is_running()) {
    Stop();
    return absl::InternalError("metrics HTTP: accept loop did not start");
  }
  return bound;
}

void MetricsHttpServer::Stop() {
  if (server_ == nullptr) return;
  server_->stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();
}

}  // namespace specserve::telemetry
