// specserve.v1 Generation, Sessions and Tokenization as they stand in this
// build: every RPC answers UNIMPLEMENTED with a message naming what is
// missing, and UNAVAILABLE while draining. Each service moves to its own file
// as it is implemented (tokenizer; sessions and bursts).
#ifndef SPECSERVE_SCHEDULER_PUBLIC_SERVICES_H_
#define SPECSERVE_SCHEDULER_PUBLIC_SERVICES_H_

#include "proto/specserve.grpc.pb.h"

namespace specserve::scheduler {

class GenerationService final
    : public specserve::v1::Generation::CallbackService {
 public:
  grpc::ServerWriteReactor<specserve::v1::GenerateEvent>* Generate(
      grpc::CallbackServerContext* ctx,
      const specserve::v1::GenerateRequest* request) override;
};

class SessionsService final : public specserve::v1::Sessions::CallbackService {
 public:
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
};

class TokenizationService final
    : public specserve::v1::Tokenization::CallbackService {
 public:
  grpc::ServerUnaryReactor* Tokenize(
      grpc::CallbackServerContext* ctx,
      const specserve::v1::TokenizeRequest* request,
      specserve::v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(
      grpc::CallbackServerContext* ctx,
      const specserve::v1::DetokenizeRequest* request,
      specserve::v1::DetokenizeResponse* response) override;
};

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_PUBLIC_SERVICES_H_
