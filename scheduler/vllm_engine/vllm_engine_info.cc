// VllmEngine's information RPCs: GetModelInfo, GetServerInfo, GetLoads (from
// admission's running and queued counts and the workers' session memory) and
// GetTokenizer (tokenizer_bundle.h).
#include <algorithm>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "scheduler/vllm_engine/tokenizer_bundle.h"
#include "scheduler/vllm_engine/vllm_engine_service.h"
#include "telemetry/grpc_reactors.h"
#include "telemetry/server_lifecycle.h"

namespace specserve::scheduler::vllm_engine {
namespace {

namespace vproto = ::vllm::grpc::engine;
namespace common = ::smg::grpc::common;
using telemetry::ToGrpc;

// Chunks of the tokenizer bundle, as vLLM's servicer cuts it.
constexpr size_t kTokenizerChunkBytes = 64 << 10;
constexpr char kServerVersion[] = "specserve-0.1.0";

// The model of the first available worker that reported one.
bool CurrentModel(const SchedulerContext& ctx, specserve::v1::ModelInfo* out) {
  for (int i = 0; i < ctx.workers->size(); ++i) {
    if (!ctx.workers->Available(i)) continue;
    const auto info = ctx.workers->Info(i);
    if (!info.has_model()) continue;
    *out = info.model();
    return true;
  }
  return false;
}

}  // namespace

std::string VllmEngineService::CurrentModelDir() const {
  specserve::v1::ModelInfo model;
  if (CurrentModel(*ctx_, &model) && !model.path().empty()) return model.path();
  return options_.model_dir;
}

grpc::Status VllmEngineService::GetModelInfo(
    grpc::ServerContext* context, const vproto::GetModelInfoRequest*,
    vproto::GetModelInfoResponse* response) {
  absl::StatusOr<Caller> caller = ctx_->Authenticate(*context);
  if (!caller.ok()) return ToGrpc(caller.status());
  specserve::v1::ModelInfo model;
  if (!CurrentModel(*ctx_, &model)) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "no worker has reported its model yet; see "
                        "specserve.v1.Admin/GetServerInfo");
  }
  response->set_model_path(model.path());
  response->set_is_generation(true);
  response->set_max_context_length(model.max_context());
  response->set_vocab_size(model.vocab_size());
  response->set_supports_vision(false);
  response->set_served_model_name(options_.served_model_name);
  response->set_tokenizer_path(model.path());
  response->set_model_type(model.model_type());
  if (!model.architecture().empty()) {
    response->add_architectures(model.architecture());
  }
  for (uint32_t id : ctx_->EosIds()) {
    response->add_eos_token_ids(static_cast<int32_t>(id));
  }
  response->set_max_req_input_len(static_cast<int32_t>(model.max_context()));
  return grpc::Status::OK;
}

grpc::Status VllmEngineService::GetServerInfo(
    grpc::ServerContext* context, const vproto::GetServerInfoRequest*,
    vproto::GetServerInfoResponse* response) {
  absl::StatusOr<Caller> caller = ctx_->Authenticate(*context);
  if (!caller.ok()) return ToGrpc(caller.status());
  response->set_active_requests(
      static_cast<uint32_t>(ctx_->admission->running()));
  response->set_is_paused(telemetry::DrainRequested());
  response->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - started_));
  // The value the protocol documents for this engine type.
  response->set_server_type("vllm-grpc");
  response->set_data_parallel_size(1);
  response->set_max_num_seqs(options_.max_running);
  return grpc::Status::OK;
}

grpc::Status VllmEngineService::GetLoads(grpc::ServerContext* context,
                                         const vproto::GetLoadsRequest*,
                                         vproto::GetLoadsResponse* response) {
  absl::StatusOr<Caller> caller = ctx_->Authenticate(*context);
  if (!caller.ok()) return ToGrpc(caller.status());
  const int running = ctx_->admission->running();
  const int queued = ctx_->admission->queued();
  uint64_t used = 0, budget = 0;
  for (int i = 0; i < ctx_->workers->size(); ++i) {
    if (!ctx_->workers->Available(i)) continue;
    const auto info = ctx_->workers->Info(i);
    used += info.memory_used_bytes();
    budget += info.memory_budget_bytes();
  }
  response->set_timestamp(absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", absl::Now(),
                                           absl::UTCTimeZone()));
  response->set_version(kServerVersion);
  response->set_dp_rank_count(1);
  vproto::SchedulerLoad* load = response->add_loads();
  load->set_dp_rank(0);
  load->set_num_running_reqs(running);
  load->set_num_waiting_reqs(queued);
  load->set_num_total_reqs(running + queued);
  load->set_token_usage(budget ? std::min(1.0, double(used) / budget) : 0.0);
  load->set_max_running_requests(options_.max_running);
  return grpc::Status::OK;
}

grpc::Status VllmEngineService::GetTokenizer(
    grpc::ServerContext* context, const common::GetTokenizerRequest*,
    grpc::ServerWriter<common::GetTokenizerChunk>* writer) {
  absl::StatusOr<Caller> caller = ctx_->Authenticate(*context);
  if (!caller.ok()) return ToGrpc(caller.status());
  const std::string dir = CurrentModelDir();
  absl::StatusOr<std::vector<std::string>> files = TokenizerFiles(dir);
  if (!files.ok()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        std::string(files.status().message()));
  }
  absl::StatusOr<std::string> zip = BuildTokenizerZip(dir, *files);
  if (!zip.ok()) return ToGrpc(zip.status());
  const std::string sha256 = Sha256Hex(*zip);
  for (size_t offset = 0; offset < zip->size();
       offset += kTokenizerChunkBytes) {
    common::GetTokenizerChunk chunk;
    chunk.set_data(zip->substr(offset, kTokenizerChunkBytes));
    if (offset + kTokenizerChunkBytes >= zip->size()) chunk.set_sha256(sha256);
    if (!writer->Write(chunk)) {
      return grpc::Status(grpc::StatusCode::CANCELLED,
                          "the client closed the stream");
    }
  }
  return grpc::Status::OK;
}

}  // namespace specserve::scheduler::vllm_engine
