// VllmEngine's request RPCs: Generate, Abort, HealthCheck, and the ones this
// server does not provide. The information RPCs are in vllm_engine_info.cc.
#include "scheduler/vllm_engine/vllm_engine_service.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "scheduler/generate_admission.h"
#include "scheduler/generate_call.h"
#include "scheduler/vllm_engine/response_adapter.h"
#include "scheduler/vllm_engine/sample_fanout.h"
#include "telemetry/grpc_reactors.h"
#include "telemetry/server_lifecycle.h"

namespace specserve::scheduler::vllm_engine {
namespace {

namespace vproto = ::vllm::grpc::engine;
namespace common = ::smg::grpc::common;
using telemetry::ToGrpc;

grpc::Status Unimplemented(absl::string_view what) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, std::string(what));
}

}  // namespace

VllmEngineService::VllmEngineService(SchedulerContext* ctx,
                                     VllmEngineOptions options)
    : ctx_(ctx), options_(std::move(options)), started_(absl::Now()) {}

grpc::Status VllmEngineService::Generate(
    grpc::ServerContext* context, const vproto::GenerateRequest* request,
    grpc::ServerWriter<vproto::GenerateResponse>* writer) {
  GenerateAdmission admission(ctx_, context);
  absl::StatusOr<Caller> caller = ctx_->Authenticate(*context);
  if (!caller.ok()) return ToGrpc(admission.Reject(caller.status()));
  if (absl::Status s = admission.AwaitLimits(); !s.ok()) return ToGrpc(s);
  absl::StatusOr<TranslatedRequest> translated =
      TranslateGenerateRequest(*request, options_.gateway, admission.limits());
  if (!translated.ok()) return ToGrpc(admission.Reject(translated.status()));
  const uint32_t n = translated->samples;
  // n > 1 with prefix reuse on: first the prompt alone (sample_fanout.h
  // PrefillRequest), which the samples fork; without it each sample
  // prefills, and a prefill first would be thrown away. Every call holds a
  // ticket before any runs: a full queue refuses the request whole.
  const bool prefill_first = n > 1 && ctx_->prefix != nullptr;
  std::vector<specserve::v1::GenerateRequest> calls;
  if (prefill_first) calls.push_back(PrefillRequest(translated->request));
  for (uint32_t i = 0; i < n; ++i) {
    calls.push_back(n == 1 ? translated->request
                           : SampleRequest(translated->request, i));
  }
  std::vector<AdmissionTicket> tickets;
  for (const specserve::v1::GenerateRequest& call : calls) {
    absl::StatusOr<AdmissionTicket> ticket = admission.Admit(call);
    if (!ticket.ok()) return ToGrpc(ticket.status());
    tickets.push_back(std::move(*ticket));
  }

  telemetry::InFlightGuard in_flight;
  auto run_call = [&](size_t c, grpc::internal::WriterInterface<
                                    specserve::v1::GenerateEvent>* events) {
    GenerateWriter out(context, events);
    return RunGenerateCall(ctx_, calls[c], caller->tenant, admission.deadline(),
                           std::move(tickets[c]), &out);
  };
  auto run_sample =
      [&](uint32_t i,
          grpc::internal::WriterInterface<vproto::GenerateResponse>* sink) {
        ResponseAdapter adapter(sink, translated->stream,
                                translated->prompt_tokens,
                                translated->first_prompt_id);
        return run_call(prefill_first ? 1 + i : i, &adapter);
      };
  if (n == 1) return run_sample(0, writer);
  if (prefill_first) {
    DiscardingEventWriter discard;
    if (grpc::Status s = run_call(0, &discard); !s.ok()) return s;
  }
  return RunSamples(n, writer, run_sample);
}

grpc::Status VllmEngineService::Abort(grpc::ServerContext* context,
                                      const vproto::AbortRequest* request,
                                      vproto::AbortResponse*) {
  absl::StatusOr<Caller> caller = ctx_->Authenticate(*context);
  if (!caller.ok()) return ToGrpc(caller.status());
  // As vLLM: ids that are not running (finished, never seen, another
  // tenant's) are no error.
  for (const std::string& id : request->request_ids()) {
    ctx_->requests->AbortRequest(caller->tenant, id);
    // The samples of an n > 1 request (SampleRequest's ids).
    for (uint32_t i = 0; i < kMaxSamples; ++i) {
      ctx_->requests->AbortRequest(caller->tenant, absl::StrCat(id, "#", i));
    }
  }
  return grpc::Status::OK;
}

grpc::Status VllmEngineService::HealthCheck(
    grpc::ServerContext*, const vproto::HealthCheckRequest*,
    vproto::HealthCheckResponse* response) {
  if (telemetry::DrainRequested()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "server is draining: no new work accepted");
  }
  if (ctx_->workers->NumAvailable() == 0) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "no worker is available; see Admin.GetServerInfo");
  }
  response->set_healthy(true);
  response->set_message(absl::StrCat(ctx_->workers->NumAvailable(), " of ",
                                     ctx_->workers->size(),
                                     " workers available"));
  return grpc::Status::OK;
}

grpc::Status VllmEngineService::Embed(grpc::ServerContext*,
                                      const vproto::EmbedRequest*,
                                      vproto::EmbedResponse*) {
  return Unimplemented(
      "Embed: specserve serves generation only, not embeddings");
}

grpc::Status VllmEngineService::FlushCache(grpc::ServerContext*,
                                           const common::FlushCacheRequest*,
                                           common::FlushCacheResponse*) {
  return Unimplemented(
      "FlushCache: specserve keeps no shared prefix cache (caches belong to "
      "sessions: close them with specserve.v1.Sessions/CloseSession)");
}

grpc::Status VllmEngineService::StartProfile(grpc::ServerContext*,
                                             const common::StartProfileRequest*,
                                             common::ProfileResponse*) {
  return Unimplemented(
      "StartProfile: specserve has no profiler RPC; use its metrics "
      "(--metrics_port)");
}

grpc::Status VllmEngineService::StopProfile(grpc::ServerContext*,
                                            const common::StopProfileRequest*,
                                            common::ProfileResponse*) {
  return Unimplemented(
      "StopProfile: specserve has no profiler RPC; use its metrics "
      "(--metrics_port)");
}

grpc::Status VllmEngineService::SubscribeKvEvents(
    grpc::ServerContext*, const common::SubscribeKvEventsRequest*,
    grpc::ServerWriter<common::KvEventBatch>*) {
  return Unimplemented(
      "SubscribeKvEvents: specserve publishes no KV cache events (its caches "
      "belong to sessions, not to a shared prefix cache); poll GetLoads");
}

}  // namespace specserve::scheduler::vllm_engine
