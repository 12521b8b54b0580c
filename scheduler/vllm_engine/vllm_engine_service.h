// vllm.grpc.engine.VllmEngine, the engine protocol of the SMG gateway
// (proto from the PyPI wheel smg-grpc-proto, tools/install_deps), served on
// the scheduler's public port beside specserve.v1, so the gateway (and its
// OpenAI-compatible HTTP API) can route to specserve like to a vLLM engine.
//
// Generate runs on the same machinery as specserve.v1 Generation: the
// request is translated (request_translator.h) and run by RunGenerateCall,
// whose events a ResponseAdapter (response_adapter.h) turns into vLLM
// chunks and completes; admission and its refusals are GenerateAdmission's
// (scheduler/generate_admission.h). Each request is one-shot (no session).
// Abort cancels by request id through the request registry (like
// Admin.Abort: the request ends "abort" at its next round boundary); a
// gateway that drops the stream cancels it as any client does.
//
// Every RPC but HealthCheck authenticates its caller like specserve.v1
// (scheduler/authenticator.h): requests belong to the token's tenant, and
// Abort reaches only the caller's. HealthCheck, like grpc.health.v1, needs
// no token: healthy while not draining and some worker is available; an
// unhealthy answer is the status UNAVAILABLE with the reason, so a caller
// that reads only the status sees it too.
//
// What this server does not provide answers UNIMPLEMENTED with the reason:
// Embed, FlushCache (no shared prefix cache: caches are per session),
// StartProfile / StopProfile, and SubscribeKvEvents (no KV events: the
// gateway then polls GetLoads).
#ifndef SPECSERVE_SCHEDULER_VLLM_ENGINE_VLLM_ENGINE_SERVICE_H_
#define SPECSERVE_SCHEDULER_VLLM_ENGINE_VLLM_ENGINE_SERVICE_H_

#include <string>

#include "absl/time/time.h"
#include "scheduler/scheduler_context.h"
#include "scheduler/vllm_engine/request_translator.h"
#include "vllm_engine.grpc.pb.h"

namespace specserve::scheduler::vllm_engine {

struct VllmEngineOptions {
  GatewayOptions gateway;
  // The model name the gateway serves (GetModelInfo.served_model_name).
  std::string served_model_name;
  // The model directory given at start: the tokenizer files' folder until a
  // worker reports its model's path (which Admin.LoadModel changes).
  std::string model_dir;
  // --max_running: GetServerInfo.max_num_seqs, GetLoads'
  // max_running_requests.
  int max_running = 0;
};

class VllmEngineService final
    : public ::vllm::grpc::engine::VllmEngine::Service {
 public:
  VllmEngineService(SchedulerContext* ctx, VllmEngineOptions options);

  grpc::Status Generate(
      grpc::ServerContext* context,
      const ::vllm::grpc::engine::GenerateRequest* request,
      grpc::ServerWriter<::vllm::grpc::engine::GenerateResponse>* writer)
      override;
  grpc::Status Embed(grpc::ServerContext* context,
                     const ::vllm::grpc::engine::EmbedRequest* request,
                     ::vllm::grpc::engine::EmbedResponse* response) override;
  grpc::Status HealthCheck(
      grpc::ServerContext* context,
      const ::vllm::grpc::engine::HealthCheckRequest* request,
      ::vllm::grpc::engine::HealthCheckResponse* response) override;
  grpc::Status FlushCache(
      grpc::ServerContext* context,
      const ::smg::grpc::common::FlushCacheRequest* request,
      ::smg::grpc::common::FlushCacheResponse* response) override;
  grpc::Status StartProfile(
      grpc::ServerContext* context,
      const ::smg::grpc::common::StartProfileRequest* request,
      ::smg::grpc::common::ProfileResponse* response) override;
  grpc::Status StopProfile(
      grpc::ServerContext* context,
      const ::smg::grpc::common::StopProfileRequest* request,
      ::smg::grpc::common::ProfileResponse* response) override;
  grpc::Status Abort(grpc::ServerContext* context,
                     const ::vllm::grpc::engine::AbortRequest* request,
                     ::vllm::grpc::engine::AbortResponse* response) override;
  grpc::Status GetModelInfo(
      grpc::ServerContext* context,
      const ::vllm::grpc::engine::GetModelInfoRequest* request,
      ::vllm::grpc::engine::GetModelInfoResponse* response) override;
  grpc::Status GetServerInfo(
      grpc::ServerContext* context,
      const ::vllm::grpc::engine::GetServerInfoRequest* request,
      ::vllm::grpc::engine::GetServerInfoResponse* response) override;
  grpc::Status GetLoads(
      grpc::ServerContext* context,
      const ::vllm::grpc::engine::GetLoadsRequest* request,
      ::vllm::grpc::engine::GetLoadsResponse* response) override;
  grpc::Status GetTokenizer(
      grpc::ServerContext* context,
      const ::smg::grpc::common::GetTokenizerRequest* request,
      grpc::ServerWriter<::smg::grpc::common::GetTokenizerChunk>* writer)
      override;
  grpc::Status SubscribeKvEvents(
      grpc::ServerContext* context,
      const ::smg::grpc::common::SubscribeKvEventsRequest* request,
      grpc::ServerWriter<::smg::grpc::common::KvEventBatch>* writer) override;

 private:
  // The model directory workers serve now (else options_.model_dir).
  std::string CurrentModelDir() const;

  SchedulerContext* const ctx_;
  const VllmEngineOptions options_;
  const absl::Time started_;
};

}  // namespace specserve::scheduler::vllm_engine

#endif  // SPECSERVE_SCHEDULER_VLLM_ENGINE_VLLM_ENGINE_SERVICE_H_
