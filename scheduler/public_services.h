// specserve.v1 Generation, Sessions and Tokenization over the shared
// SchedulerContext. Generate is a synchronous handler: each request runs to
// completion on the gRPC thread that received it (generate_call.h), so its
// tokens go from the worker's stream to the client's on one thread; the cheap
// refusals (draining, malformed input, a full queue) happen before any
// tokenization. Every handler first authenticates its caller
// (SchedulerContext::Authenticate): the sessions and requests it reaches are
// the caller's tenant's only.
#ifndef SPECSERVE_SCHEDULER_PUBLIC_SERVICES_H_
#define SPECSERVE_SCHEDULER_PUBLIC_SERVICES_H_

#include "proto/specserve.grpc.pb.h"
#include "scheduler/scheduler_context.h"

namespace specserve::scheduler {

// Generate reads its request raw (the method is registered as split
// streamed over bytes) and parses it itself: a request that does not parse
// gets INVALID_ARGUMENT naming the field (scheduler/request_parsing.h), where
// gRPC's own deserializer answers INTERNAL with no message before any
// handler runs. On the wire it is the same server-streaming method.
class GenerationService final : public specserve::v1::Generation::Service {
 public:
  explicit GenerationService(SchedulerContext* ctx);

 private:
  grpc::Status HandleGenerate(
      grpc::ServerContext* ctx,
      grpc::ServerSplitStreamer<grpc::ByteBuffer, specserve::v1::GenerateEvent>*
          stream);

  SchedulerContext* const ctx_;
};

// Sessions and Tokenization parse their requests themselves too (each method
// is registered as streamed over bytes, request_parsing.h), so every RPC of
// theirs answers a request that does not parse with INVALID_ARGUMENT.
class SessionsService final : public specserve::v1::Sessions::Service {
 public:
  explicit SessionsService(SchedulerContext* ctx);
  grpc::Status OpenSession(grpc::ServerContext* ctx,
                           const specserve::v1::OpenSessionRequest* request,
                           specserve::v1::SessionInfo* response) override;
  grpc::Status GetSession(grpc::ServerContext* ctx,
                          const specserve::v1::GetSessionRequest* request,
                          specserve::v1::SessionInfo* response) override;
  grpc::Status ListSessions(
      grpc::ServerContext* ctx,
      const specserve::v1::ListSessionsRequest* request,
      specserve::v1::ListSessionsResponse* response) override;
  grpc::Status CloseSession(
      grpc::ServerContext* ctx,
      const specserve::v1::CloseSessionRequest* request,
      specserve::v1::CloseSessionResponse* response) override;

 private:
  std::vector<std::string> WorkerAddresses() const;
  SchedulerContext* const ctx_;
};

class TokenizationService final : public specserve::v1::Tokenization::Service {
 public:
  explicit TokenizationService(SchedulerContext* ctx);
  grpc::Status Tokenize(grpc::ServerContext* ctx,
                        const specserve::v1::TokenizeRequest* request,
                        specserve::v1::TokenizeResponse* response) override;
  grpc::Status Detokenize(grpc::ServerContext* ctx,
                          const specserve::v1::DetokenizeRequest* request,
                          specserve::v1::DetokenizeResponse* response) override;

 private:
  SchedulerContext* const ctx_;
};

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_PUBLIC_SERVICES_H_
