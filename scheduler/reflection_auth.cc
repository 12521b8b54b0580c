#include "scheduler/reflection_auth.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace specserve::scheduler {
namespace {

namespace pb = google::protobuf;
using grpc::experimental::InterceptionHookPoints;

// Every version of the service (v1alpha, v1) lives under this package.
constexpr absl::string_view kReflectionMethods = "/grpc.reflection.";

// The serialized <package>.ServerReflectionResponse of `method`
// ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo") whose
// error_response carries `status`. Built from the descriptors the reflection
// library registered, so no copy of its .proto is needed. Empty (a valid
// empty response; the status still tells) should the type be unknown.
std::string ErrorResponse(absl::string_view method,
                          const absl::Status& status) {
  const absl::string_view service =
      method.substr(1, method.find('/', 1) - 1);  // package.Service
  const absl::string_view package = service.substr(0, service.rfind('.'));
  const pb::Descriptor* type =
      pb::DescriptorPool::generated_pool()->FindMessageTypeByName(
          absl::StrCat(package, ".ServerReflectionResponse"));
  const pb::FieldDescriptor* error_field =
      type == nullptr ? nullptr : type->FindFieldByName("error_response");
  const pb::FieldDescriptor* code_field =
      error_field == nullptr || error_field->message_type() == nullptr
          ? nullptr
          : error_field->message_type()->FindFieldByName("error_code");
  const pb::FieldDescriptor* message_field =
      code_field == nullptr
          ? nullptr
          : error_field->message_type()->FindFieldByName("error_message");
  if (message_field == nullptr ||
      code_field->cpp_type() != pb::FieldDescriptor::CPPTYPE_INT32 ||
      message_field->cpp_type() != pb::FieldDescriptor::CPPTYPE_STRING) {
    LOG_FIRST_N(WARNING, 1) << "no ServerReflectionResponse type for " << method
                            << ": refusing with an empty response";
    return "";
  }
  std::unique_ptr<pb::Message> response(
      pb::MessageFactory::generated_factory()->GetPrototype(type)->New());
  pb::Message* error =
      response->GetReflection()->MutableMessage(response.get(), error_field);
  error->GetReflection()->SetInt32(error, code_field,
                                   static_cast<int32_t>(status.code()));
  error->GetReflection()->SetString(error, message_field,
                                    std::string(status.message()));
  return response->SerializeAsString();
}

class ReflectionAuthInterceptor final : public grpc::experimental::Interceptor {
 public:
  ReflectionAuthInterceptor(const Authenticator* auth, std::string method)
      : auth_(auth), method_(std::move(method)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    // The client's metadata arrives before anything is sent.
    if (m->QueryInterceptionHookPoint(
            InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      refusal_ = auth_->Authenticate(*m->GetRecvInitialMetadata()).status();
    }
    if (!refusal_.ok()) {
      if (m->QueryInterceptionHookPoint(
              InterceptionHookPoints::PRE_SEND_MESSAGE)) {
        const std::string bytes = ErrorResponse(method_, refusal_);
        grpc::Slice slice(bytes);
        *m->GetSerializedSendMessage() = grpc::ByteBuffer(&slice, 1);
      }
      if (m->QueryInterceptionHookPoint(
              InterceptionHookPoints::PRE_SEND_STATUS)) {
        m->ModifySendStatus(
            grpc::Status(static_cast<grpc::StatusCode>(refusal_.code()),
                         std::string(refusal_.message())));
      }
    }
    m->Proceed();
  }

 private:
  const Authenticator* const auth_;
  const std::string method_;
  absl::Status refusal_;
};

}  // namespace

grpc::experimental::Interceptor*
ReflectionAuthInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  if (info->method() == nullptr ||
      !absl::StartsWith(info->method(), kReflectionMethods) ||
      !auth_->enabled()) {
    return nullptr;
  }
  return new ReflectionAuthInterceptor(auth_, info->method());
}

}  // namespace specserve::scheduler
