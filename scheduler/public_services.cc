#include "scheduler/public_services.h"

#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "scheduler/generate_admission.h"
#include "scheduler/generate_call.h"
#include "scheduler/request_parsing.h"
#include "scheduler/request_validation.h"
#include "telemetry/grpc_reactors.h"
#include "telemetry/server_lifecycle.h"

namespace specserve::scheduler {
namespace {

namespace v1 = specserve::v1;
using specserve::v1::GenerateEvent;
using telemetry::ToGrpc;

grpc::Status Draining() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "server is draining: no new work accepted");
}

grpc::Status NoTokenizer() {
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                      "this model directory has no tokenizer.json");
}

}  // namespace

GenerationService::GenerationService(SchedulerContext* ctx) : ctx_(ctx) {
  MarkMethodStreamed(
      MethodIndex("specserve.v1.Generation", "Generate"),
      new grpc::internal::SplitServerStreamingHandler<grpc::ByteBuffer,
                                                      GenerateEvent>(
          [this](grpc::ServerContext* context,
                 grpc::ServerSplitStreamer<grpc::ByteBuffer, GenerateEvent>*
                     stream) { return HandleGenerate(context, stream); }));
}

grpc::Status GenerationService::HandleGenerate(
    grpc::ServerContext* ctx,
    grpc::ServerSplitStreamer<grpc::ByteBuffer, GenerateEvent>* stream) {
  auto refuse = [this](absl::Status s) {
    ctx_->metrics->requests_rejected(s.code())->Increment();
    return ToGrpc(s);
  };
  absl::StatusOr<Caller> caller = ctx_->Authenticate(*ctx);
  if (!caller.ok()) return refuse(caller.status());
  // Cheap checks first: nothing is tokenized or queued for a bad request
  // (the steps and their order: scheduler/generate_admission.h).
  GenerateAdmission admission(ctx_, ctx);
  if (absl::Status s = admission.AwaitLimits(); !s.ok()) return ToGrpc(s);
  // A server-streaming call carries exactly one request message; none means
  // the client half-closed without one (or went away).
  grpc::ByteBuffer raw;
  if (!stream->Read(&raw)) {
    return refuse(
        absl::InvalidArgumentError("Generate got no request message"));
  }
  specserve::v1::GenerateRequest request;
  if (absl::Status s = ParseRequest(&raw, &request); !s.ok()) {
    return refuse(s);
  }
  uint32_t inject_nan_at = 0;
  if (ctx_->options.enable_fault_injection) {
    // Tests only (docs/RELIABILITY.md row 8); see kInjectNanAtMetadata.
    const auto& md = ctx->client_metadata();
    auto it = md.find(kInjectNanAtMetadata);
    if (it != md.end() &&
        !absl::SimpleAtoi(
            absl::string_view(it->second.data(), it->second.size()),
            &inject_nan_at)) {
      return refuse(absl::InvalidArgumentError(
          absl::StrCat(kInjectNanAtMetadata, " must be a token index")));
    }
  }
  absl::StatusOr<AdmissionTicket> ticket = admission.Admit(request);
  if (!ticket.ok()) return ToGrpc(ticket.status());

  telemetry::InFlightGuard in_flight;
  GenerateWriter writer(ctx, stream);
  return RunGenerateCall(ctx_, request, caller->tenant, admission.deadline(),
                         std::move(*ticket), &writer, inject_nan_at);
}

SessionsService::SessionsService(SchedulerContext* ctx) : ctx_(ctx) {
  constexpr char kService[] = "specserve.v1.Sessions";
  MarkMethodStreamed(
      MethodIndex(kService, "OpenSession"),
      ParsingUnaryHandler<v1::OpenSessionRequest, v1::SessionInfo>(
          [this](auto* c, auto* q, auto* r) { return OpenSession(c, q, r); }));
  MarkMethodStreamed(
      MethodIndex(kService, "GetSession"),
      ParsingUnaryHandler<v1::GetSessionRequest, v1::SessionInfo>(
          [this](auto* c, auto* q, auto* r) { return GetSession(c, q, r); }));
  MarkMethodStreamed(
      MethodIndex(kService, "ListSessions"),
      ParsingUnaryHandler<v1::ListSessionsRequest, v1::ListSessionsResponse>(
          [this](auto* c, auto* q, auto* r) { return ListSessions(c, q, r); }));
  MarkMethodStreamed(
      MethodIndex(kService, "CloseSession"),
      ParsingUnaryHandler<v1::CloseSessionRequest, v1::CloseSessionResponse>(
          [this](auto* c, auto* q, auto* r) { return CloseSession(c, q, r); }));
}

std::vector<std::string> SessionsService::WorkerAddresses() const {
  std::vector<std::string> out;
  for (int i = 0; i < ctx_->workers->size(); ++i) {
    out.push_back(ctx_->workers->address(i));
  }
  return out;
}

grpc::Status SessionsService::OpenSession(
    grpc::ServerContext* ctx, const specserve::v1::OpenSessionRequest* request,
    specserve::v1::SessionInfo* response) {
  absl::StatusOr<Caller> caller = ctx_->Authenticate(*ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  if (telemetry::DrainRequested()) return Draining();
  Limits limits;
  if (ctx_->CurrentLimits(&limits)) {
    absl::Status valid =
        ValidateSessionCapacity(request->capacity(), limits, "capacity");
    if (!valid.ok()) return ToGrpc(valid);
  }
  auto snap = ctx_->sessions->Open(request->capacity(), caller->tenant);
  if (!snap.ok()) return ToGrpc(snap.status());
  *response = snap->ToProto(WorkerAddresses());
  return grpc::Status::OK;
}

grpc::Status SessionsService::GetSession(
    grpc::ServerContext* ctx, const specserve::v1::GetSessionRequest* request,
    specserve::v1::SessionInfo* response) {
  absl::StatusOr<Caller> caller = ctx_->Authenticate(*ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  auto snap = ctx_->sessions->Get(request->session_id(), caller->tenant);
  if (!snap.ok()) return ToGrpc(snap.status());
  *response = snap->ToProto(WorkerAddresses());
  return grpc::Status::OK;
}

grpc::Status SessionsService::ListSessions(
    grpc::ServerContext* ctx, const specserve::v1::ListSessionsRequest*,
    specserve::v1::ListSessionsResponse* response) {
  absl::StatusOr<Caller> caller = ctx_->Authenticate(*ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  const std::vector<std::string> addresses = WorkerAddresses();
  for (const SessionSnapshot& s : ctx_->sessions->List(caller->tenant)) {
    *response->add_sessions() = s.ToProto(addresses);
  }
  return grpc::Status::OK;
}

grpc::Status SessionsService::CloseSession(
    grpc::ServerContext* ctx, const specserve::v1::CloseSessionRequest* request,
    specserve::v1::CloseSessionResponse*) {
  absl::StatusOr<Caller> caller = ctx_->Authenticate(*ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  auto closed = ctx_->sessions->Close(request->session_id(), caller->tenant);
  if (!closed.ok()) return ToGrpc(closed.status());
  if (closed->was_busy) {
    ctx_->requests->AbortSession(caller->tenant, request->session_id());
  }
  // Free the worker's copy (best effort: a dead worker has none anyway).
  // (Unreachable now, e.g. hung or restarting: freed when it answers again.)
  if (closed->worker >= 0 && !closed->was_busy) {
    ctx_->workers->ReleaseNowOrLater(closed->worker, request->session_id());
  }
  return grpc::Status::OK;
}

TokenizationService::TokenizationService(SchedulerContext* ctx) : ctx_(ctx) {
  constexpr char kService[] = "specserve.v1.Tokenization";
  MarkMethodStreamed(
      MethodIndex(kService, "Tokenize"),
      ParsingUnaryHandler<v1::TokenizeRequest, v1::TokenizeResponse>(
          [this](auto* c, auto* q, auto* r) { return Tokenize(c, q, r); }));
  MarkMethodStreamed(
      MethodIndex(kService, "Detokenize"),
      ParsingUnaryHandler<v1::DetokenizeRequest, v1::DetokenizeResponse>(
          [this](auto* c, auto* q, auto* r) { return Detokenize(c, q, r); }));
}

grpc::Status TokenizationService::Tokenize(
    grpc::ServerContext* ctx, const specserve::v1::TokenizeRequest* request,
    specserve::v1::TokenizeResponse* response) {
  if (absl::StatusOr<Caller> caller = ctx_->Authenticate(*ctx); !caller.ok()) {
    return ToGrpc(caller.status());
  }
  const auto tokenizer = ctx_->Tokenizer();
  if (tokenizer == nullptr) return NoTokenizer();
  if (request->text().size() > ctx_->limits.max_text_bytes) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "text is too long");
  }
  for (uint32_t id :
       tokenizer->Encode(request->text(), request->parse_special())) {
    response->add_ids(id);
  }
  return grpc::Status::OK;
}

grpc::Status TokenizationService::Detokenize(
    grpc::ServerContext* ctx, const specserve::v1::DetokenizeRequest* request,
    specserve::v1::DetokenizeResponse* response) {
  if (absl::StatusOr<Caller> caller = ctx_->Authenticate(*ctx); !caller.ok()) {
    return ToGrpc(caller.status());
  }
  const auto tokenizer = ctx_->Tokenizer();
  if (tokenizer == nullptr) return NoTokenizer();
  std::vector<uint32_t> ids(request->ids().begin(), request->ids().end());
  auto text = tokenizer->Decode(ids, request->skip_special());
  if (!text.ok()) return ToGrpc(text.status());
  response->set_text(std::move(*text));
  return grpc::Status::OK;
}

}  // namespace specserve::scheduler
