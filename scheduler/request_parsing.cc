#include "scheduler/request_parsing.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "google/protobuf/stubs/common.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace specserve::scheduler {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

// Walks `bytes` as a message of `type` whose path is `prefix` ("" at the
// top); sets `why` and returns true at the first problem. Every wire field
// parses as an unknown field whatever its declared type, so the walk sees
// what the strict parser refused.
bool Diagnose(const Descriptor& type, absl::string_view bytes,
              const std::string& prefix, std::string* why) {
  UnknownFieldSet fields;
  if (!fields.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    *why = absl::StrCat(prefix.empty() ? "the request" : prefix,
                        " is not a protobuf message of type ", type.full_name(),
                        " (malformed wire format)");
    return true;
  }
  std::map<int, int> occurrences;  // index of each repeated field's element
  for (int i = 0; i < fields.field_count(); ++i) {
    const UnknownField& f = fields.field(i);
    const int index = occurrences[f.number()]++;
    const FieldDescriptor* d = type.FindFieldByNumber(f.number());
    // A field of the wrong wire type is kept as unknown by the parser too.
    if (d == nullptr || f.type() != UnknownField::TYPE_LENGTH_DELIMITED) {
      continue;
    }
    std::string path =
        prefix.empty() ? d->name() : absl::StrCat(prefix, ".", d->name());
    if (d->is_repeated()) absl::StrAppend(&path, "[", index, "]");
    const std::string& value = f.length_delimited();
    if (d->type() == FieldDescriptor::TYPE_STRING) {
      // The check the parser applies to proto3 strings.
      if (!google::protobuf::internal::IsStructurallyValidUTF8(value)) {
        *why = absl::StrCat(path, " is not valid UTF-8 (", value.size(),
                            " bytes); send text as UTF-8");
        return true;
      }
    } else if (d->type() == FieldDescriptor::TYPE_MESSAGE) {
      if (Diagnose(*d->message_type(), value, path, why)) return true;
    }
  }
  return false;
}

}  // namespace

absl::Status ParseRequest(absl::string_view bytes,
                          google::protobuf::Message* out) {
  out->Clear();
  if (out->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::OkStatus();
  }
  std::string why = DiagnoseUnparseable(*out->GetDescriptor(), bytes);
  if (why.empty()) {
    why = absl::StrCat("the request does not parse as ",
                       out->GetDescriptor()->full_name());
  }
  return absl::InvalidArgumentError(why);
}

absl::Status ParseRequest(grpc::ByteBuffer* raw,
                          google::protobuf::Message* out) {
  {
    // Straight from gRPC's slices, as its own deserializer does; the bytes
    // are gathered only to say why a request does not parse.
    grpc::ProtoBufferReader reader(raw);
    if (reader.status().ok() && out->ParseFromZeroCopyStream(&reader)) {
      raw->Clear();
      return absl::OkStatus();
    }
  }
  std::vector<grpc::Slice> slices;
  if (!raw->Dump(&slices).ok()) {
    return absl::InvalidArgumentError("the request message is unreadable");
  }
  std::string bytes;
  bytes.reserve(raw->Length());
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  raw->Clear();
  return ParseRequest(bytes, out);
}

int MethodIndex(absl::string_view service, absl::string_view method) {
  const google::protobuf::ServiceDescriptor* s =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          std::string(service));
  CHECK(s != nullptr) << "no service " << service;
  const google::protobuf::MethodDescriptor* m =
      s->FindMethodByName(std::string(method));
  CHECK(m != nullptr) << "no method " << method << " in " << service;
  return m->index();
}

std::string DiagnoseUnparseable(const Descriptor& type,
                                absl::string_view bytes) {
  std::string why;
  Diagnose(type, bytes, "", &why);
  return why;
}

}  // namespace specserve::scheduler
