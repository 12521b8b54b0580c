#include "telemetry/metrics_http.h"

#include <atomic>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "telemetry/metrics.h"

namespace specserve::telemetry {
namespace {

using ::testing::HasSubstr;

TEST(MetricsHttpTest, ServesMetricsAndHealth) {
  Registry registry;
  registry.AddCounter("vllm:generation_tokens_total", "Generated.")
      ->Increment(42);
  std::atomic<bool> healthy{true};
  MetricsHttpServer server([&] { return registry.RenderText(); },
                           [&] { return healthy.load(); });
  absl::StatusOr<int> port = server.Start(0);
  ASSERT_TRUE(port.ok()) << port.status();
  ASSERT_GT(*port, 0);
  EXPECT_EQ(server.port(), *port);

  httplib::Client client("127.0.0.1", *port);
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4");
  EXPECT_THAT(res->body, HasSubstr("# TYPE vllm:generation_tokens_total "
                                   "counter\nvllm:generation_tokens_total "
                                   "42\n"));

  // Fresh content on every scrape.
  registry.AddCounter("vllm:generation_tokens_total", "Generated.")
      ->Increment(1);
  res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_THAT(res->body, HasSubstr("vllm:generation_tokens_total 43\n"));

  res = client.Get("/healthz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  healthy = false;
  res = client.Get("/healthz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);

  res = client.Get("/nope");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);

  server.Stop();
  server.Stop();  // idempotent
  httplib::Client after("127.0.0.1", *port);
  after.set_connection_timeout(1, 0);
  EXPECT_FALSE(after.Get("/metrics"));
}

TEST(MetricsHttpTest, BusyPortIsReported) {
  MetricsHttpServer first([] { return std::string(); }, nullptr);
  absl::StatusOr<int> port = first.Start(0);
  ASSERT_TRUE(port.ok());
  MetricsHttpServer second([] { return std::string(); }, nullptr);
  absl::StatusOr<int> clash = second.Start(*port);
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(first.Start(0).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(MetricsHttpTest, StopRightAfterStartDoesNotHang) {
  for (int i = 0; i < 5; ++i) {
    MetricsHttpServer server([] { return std::string("x"); }, nullptr);
    ASSERT_TRUE(server.Start(0).ok());
    server.Stop();
  }
}

TEST(MetricsHttpTest, StopWithoutStart) {
  MetricsHttpServer server([] { return std::string(); }, nullptr);
  server.Stop();
  EXPECT_EQ(server.port(), 0);
}

}  // namespace
}  // namespace specserve::telemetry
