#include "scheduler/public_services.h"

#include <string>

#include "telemetry/grpc_reactors.h"
#include "telemetry/server_lifecycle.h"

namespace specserve::scheduler {
namespace {

using specserve::v1::GenerateEvent;
using telemetry::FinishUnary;

grpc::Status Refuse(const std::string& rpc, const std::string& missing) {
  if (telemetry::DrainRequested()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "server is draining: no new work accepted");
  }
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                      rpc + " is not implemented in this build yet: " + missing);
}

constexpr char kNoSessions[] =
    "generation needs the speculative-session engine and the scheduler's "
    "session table, which have not landed";
constexpr char kNoTokenizer[] =
    "the tokenizer.json tokenizer has not landed; send token ids";

}  // namespace

grpc::ServerWriteReactor<GenerateEvent>* GenerationService::Generate(
    grpc::CallbackServerContext*, const specserve::v1::GenerateRequest*) {
  return new telemetry::FinishedWriteReactor<GenerateEvent>(
      Refuse("Generate", kNoSessions));
}

grpc::ServerUnaryReactor* SessionsService::OpenSession(
    grpc::CallbackServerContext* ctx, const specserve::v1::OpenSessionRequest*,
    specserve::v1::SessionInfo*) {
  return FinishUnary(ctx, Refuse("OpenSession", kNoSessions));
}

grpc::ServerUnaryReactor* SessionsService::GetSession(
    grpc::CallbackServerContext* ctx, const specserve::v1::GetSessionRequest*,
    specserve::v1::SessionInfo*) {
  return FinishUnary(ctx, Refuse("GetSession", kNoSessions));
}

grpc::ServerUnaryReactor* SessionsService::ListSessions(
    grpc::CallbackServerContext* ctx, const specserve::v1::ListSessionsRequest*,
    specserve::v1::ListSessionsResponse*) {
  return FinishUnary(ctx, Refuse("ListSessions", kNoSessions));
}

grpc::ServerUnaryReactor* SessionsService::CloseSession(
    grpc::CallbackServerContext* ctx, const specserve::v1::CloseSessionRequest*,
    specserve::v1::CloseSessionResponse*) {
  return FinishUnary(ctx, Refuse("CloseSession", kNoSessions));
}

grpc::ServerUnaryReactor* TokenizationService::Tokenize(
    grpc::CallbackServerContext* ctx, const specserve::v1::TokenizeRequest*,
    specserve::v1::TokenizeResponse*) {
  return FinishUnary(ctx, Refuse("Tokenize", kNoTokenizer));
}

grpc::ServerUnaryReactor* TokenizationService::Detokenize(
    grpc::CallbackServerContext* ctx, const specserve::v1::DetokenizeRequest*,
    specserve::v1::DetokenizeResponse*) {
  return FinishUnary(ctx, Refuse("Detokenize", kNoTokenizer));
}

}  // namespace specserve::scheduler
