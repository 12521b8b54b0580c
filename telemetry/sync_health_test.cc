#include "telemetry/sync_health.h"

#include "gtest/gtest.h"

namespace specserve::telemetry {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

grpc::Status Check(SyncHealthService* health, const std::string& service,
                   HealthCheckResponse* response) {
  HealthCheckRequest request;
  request.set_service(service);
  grpc::ServerContext ctx;
  return health->Check(&ctx, &request, response);
}

TEST(SyncHealthServiceTest, UnknownServiceIsNotFound) {
  SyncHealthService health;
  HealthCheckResponse response;
  EXPECT_EQ(Check(&health, "", &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST(SyncHealthServiceTest, ReportsWhatWasSet) {
  SyncHealthService health;
  health.SetServingStatus("", true);
  health.SetServingStatus("a.B", false);
  HealthCheckResponse response;
  ASSERT_TRUE(Check(&health, "", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
  ASSERT_TRUE(Check(&health, "a.B", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
}

TEST(SyncHealthServiceTest, SetAllChangesEveryKnownService) {
  SyncHealthService health;
  health.SetServingStatus("", true);
  health.SetServingStatus("a.B", true);
  health.SetServingStatus(false);
  HealthCheckResponse response;
  ASSERT_TRUE(Check(&health, "", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  ASSERT_TRUE(Check(&health, "a.B", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
}

TEST(SyncHealthServiceTest, ShutdownIsFinal) {
  SyncHealthService health;
  health.SetServingStatus("", true);
  health.Shutdown();
  health.SetServingStatus("", true);
  HealthCheckResponse response;
  ASSERT_TRUE(Check(&health, "", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
}

}  // namespace
}  // namespace specserve::telemetry
