// Parsing of a request message from its wire bytes, for RPCs that take their
// request raw (Generation.Generate: public_services.h). gRPC's own
// deserializer answers a request that does not parse with INTERNAL and an
// empty message before any handler runs; proto3 refuses a string field that
// is not valid UTF-8 that way too. Here such a request gets INVALID_ARGUMENT
// naming what is wrong: the string field that is not UTF-8 (a path such as
// "stopping.stop[1]"), or that the bytes are not a protobuf message at all.
#ifndef SPECSERVE_SCHEDULER_REQUEST_PARSING_H_
#define SPECSERVE_SCHEDULER_REQUEST_PARSING_H_

#include <functional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/method_handler.h"
#include "grpcpp/support/sync_stream.h"

namespace specserve::scheduler {

// Parses `bytes` into `out` (cleared first). INVALID_ARGUMENT as above when
// they do not parse.
absl::Status ParseRequest(absl::string_view bytes,
                          google::protobuf::Message* out);
// The same for a message as gRPC received it (`raw` is consumed).
absl::Status ParseRequest(grpc::ByteBuffer* raw,
                          google::protobuf::Message* out);

// The index of `method` in `service` (full name), which is its index in the
// generated service (methods are added in proto order). CHECK-fails for an
// unknown one.
int MethodIndex(absl::string_view service, absl::string_view method);

// A handler for a unary method of a synchronous service that parses the
// request itself (as ParseRequest) and then calls `fn`. A service registers
// it from its constructor:
//   MarkMethodStreamed(MethodIndex("specserve.v1.Sessions", "GetSession"),
//                      ParsingUnaryHandler<Request, Response>(...));
template <class Request, class Response>
grpc::internal::MethodHandler* ParsingUnaryHandler(
    std::function<grpc::Status(grpc::ServerContext*, const Request*, Response*)>
        fn) {
  return new grpc::internal::StreamedUnaryHandler<grpc::ByteBuffer, Response>(
      [fn = std::move(fn)](
          grpc::ServerContext* ctx,
          grpc::ServerUnaryStreamer<grpc::ByteBuffer, Response>* stream) {
        grpc::ByteBuffer raw;
        if (!stream->Read(&raw)) {
          return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              "the call carried no request message");
        }
        Request request;
        if (absl::Status s = ParseRequest(&raw, &request); !s.ok()) {
          return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                              std::string(s.message()));
        }
        Response response;
        grpc::Status status = fn(ctx, &request, &response);
        // The handler fails a call that ends OK without its one response.
        if (status.ok()) stream->Write(response);
        return status;
      });
}

// Why `bytes` do not parse as a message of type `type`: the path of the
// first string field (in wire order) that is not valid UTF-8, or a
// malformed wire format. Empty when nothing is found.
std::string DiagnoseUnparseable(const google::protobuf::Descriptor& type,
                                absl::string_view bytes);

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_REQUEST_PARSING_H_
