// specserve.v1 Generation, Sessions and Tokenization over the shared
// SchedulerContext. Generate runs each request on its own thread
// (generate_call.h); the cheap refusals (draining, malformed input, a full
// queue) happen before any thread or tokenization.
#ifndef SPECSERVE_SCHEDULER_PUBLIC_SERVICES_H_
#define SPECSERVE_SCHEDULER_PUBLIC_SERVICES_H_

#include "proto/specserve.grpc.pb.h"
#include "scheduler/scheduler_context.h"

namespace specserve::scheduler {

class GenerationService final
    : public specserve::v1::Generation::CallbackService {
 public:
  explicit GenerationService(SchedulerContext* ctx) : ctx_(ctx) {}
  grpc::ServerWriteReactor<specserve::v1::GenerateEvent>* Generate(
      grpc::CallbackServerContext* ctx,
      const specserve::v1::GenerateRequest* request) override;

 private:
  SchedulerContext* const ctx_;
};

class SessionsService final : public specserve::v1::Sessions::CallbackService {
 public:
  explicit SessionsService(SchedulerContext* ctx) : ctx_(ctx) {}
  grpc::ServerUnaryReactor* OpenSession(
      grpc::CallbackServerContext* ctx,
      const specserve::v1::OpenSessionRequest* request,
      specserve::v1::SessionInfo* response) override;
  grpc::ServerUnaryReactor* GetSession(
      grpc::CallbackServerContext* ctx,
      const specserve::v1::GetSessionRequest* request,
      specserve::v1::SessionInfo* response) override;
  grpc::ServerUnaryReactor* ListSessions(
      grpc::CallbackServerContext* ctx,
      const specserve::v1::ListSessionsRequest* request,
      specserve::v1::ListSessionsResponse* response) override;
  grpc::ServerUnaryReactor* CloseSession(
      grpc::CallbackServerContext* ctx,
      const specserve::v1::CloseSessionRequest* request,
      specserve::v1::CloseSessionResponse* response) override;

 private:
  std::vector<std::string> WorkerAddresses() const;
  SchedulerContext* const ctx_;
};

class TokenizationService final
    : public specserve::v1::Tokenization::CallbackService {
 public:
  explicit TokenizationService(SchedulerContext* ctx) : ctx_(ctx) {}
  grpc::ServerUnaryReactor* Tokenize(
      grpc::CallbackServerContext* ctx,
      const specserve::v1::TokenizeRequest* request,
      specserve::v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(
      grpc::CallbackServerContext* ctx,
      const specserve::v1::DetokenizeRequest* request,
      specserve::v1::DetokenizeResponse* response) override;

 private:
  SchedulerContext* const ctx_;
};

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_PUBLIC_SERVICES_H_
