#include "scheduler/request_parsing.h"

#include <string>

#include "gmock/gmock.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"
#include "proto/specserve.pb.h"

namespace specserve::scheduler {
namespace {

namespace v1 = specserve::v1;
using ::testing::HasSubstr;

// `req` serialized, with its one occurrence of `placeholder` (two ASCII
// bytes) replaced by an invalid UTF-8 pair of the same length.
std::string WithInvalidUtf8(const v1::GenerateRequest& req,
                            const std::string& placeholder) {
  std::string bytes = req.SerializeAsString();
  const size_t at = bytes.find(placeholder);
  EXPECT_NE(at, std::string::npos);
  EXPECT_EQ(bytes.find(placeholder, at + 1), std::string::npos);
  bytes.replace(at, placeholder.size(), "\xc3\x28");
  return bytes;
}

void ExpectInvalid(const std::string& bytes, const std::string& fragment) {
  v1::GenerateRequest out;
  absl::Status s = ParseRequest(bytes, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(fragment));
}

TEST(RequestParsingTest, ParsesAValidRequest) {
  v1::GenerateRequest req;
  req.set_text("héllo");
  req.mutable_stopping()->add_stop("\n\n");
  req.mutable_session()->set_session_id("ses_1");
  v1::GenerateRequest out;
  ASSERT_TRUE(ParseRequest(req.SerializeAsString(), &out).ok());
  EXPECT_EQ(out.text(), "héllo");
  EXPECT_EQ(out.stopping().stop(0), "\n\n");
  EXPECT_EQ(out.session().session_id(), "ses_1");
}

TEST(RequestParsingTest, NamesTheStringFieldThatIsNotUtf8) {
  v1::GenerateRequest text;
  text.set_text("XY");
  ExpectInvalid(WithInvalidUtf8(text, "XY"), "text is not valid UTF-8");

  v1::GenerateRequest stop;
  stop.set_text("hello");
  stop.mutable_stopping()->add_stop("ok");
  stop.mutable_stopping()->add_stop("XY");
  ExpectInvalid(WithInvalidUtf8(stop, "XY"),
                "stopping.stop[1] is not valid UTF-8");

  v1::GenerateRequest session;
  session.set_text("hello");
  session.mutable_session()->set_session_id("XY");
  ExpectInvalid(WithInvalidUtf8(session, "XY"),
                "session.session_id is not valid UTF-8");
}

TEST(RequestParsingTest, MalformedWireFormat) {
  ExpectInvalid(std::string("\xff\xff\xff\xff", 4),
                "is not a protobuf message of type "
                "specserve.v1.GenerateRequest");
  // A length prefix past the end of the message.
  ExpectInvalid(std::string("\x0a\x10"
                            "ab",
                            4),
                "malformed wire format");
  // A nested message that is itself malformed is named by its path.
  ExpectInvalid(std::string("\x22\x02\xff\xff", 4),
                "stopping is not a protobuf message");
}

TEST(RequestParsingTest, FromAByteBuffer) {
  v1::GenerateRequest req;
  req.set_text("hello");
  grpc::Slice good(req.SerializeAsString());
  grpc::ByteBuffer raw(&good, 1);
  v1::GenerateRequest out;
  ASSERT_TRUE(ParseRequest(&raw, &out).ok());
  EXPECT_EQ(out.text(), "hello");

  req.set_text("XY");
  grpc::Slice bad(WithInvalidUtf8(req, "XY"));
  grpc::ByteBuffer bad_raw(&bad, 1);
  absl::Status s = ParseRequest(&bad_raw, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("text is not valid UTF-8"));
}

TEST(RequestParsingTest, DiagnosisFindsNothingInAValidMessage) {
  v1::GenerateRequest req;
  req.set_text("fine");
  EXPECT_EQ(DiagnoseUnparseable(*v1::GenerateRequest::descriptor(),
                                req.SerializeAsString()),
            "");
}

}  // namespace
}  // namespace specserve::scheduler
