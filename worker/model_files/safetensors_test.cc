#include "worker/model_files/safetensors.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/model_files/checkpoint.h"
#include "worker/model_files/test_util.h"

namespace specserve::model_files {
namespace {

using ::testing::HasSubstr;
using testing::SafetensorsBytes;
using testing::SafetensorsFromHeader;
using testing::TensorMap;

absl::StatusOr<std::vector<SafetensorsEntry>> Parse(const std::string& b) {
  return ParseSafetensors(reinterpret_cast<const uint8_t*>(b.data()), b.size(),
                          "w.safetensors");
}

TEST(SafetensorsTest, ParsesEntries) {
  TensorMap m;
  m["a"] = {"F32", {2, 3}, std::string(24, '\1')};
  m["b"] = {"BF16", {4}, std::string(8, '\2')};
  m["c"] = {"F16", {}, std::string(2, '\3')};
  const std::string bytes = SafetensorsBytes(m);
  auto entries = Parse(bytes);
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 3u);
  std::map<std::string, SafetensorsEntry> by_name;
  for (const auto& e : *entries) by_name[e.name] = e;
  EXPECT_EQ(by_name["a"].dtype, DType::kF32);
  EXPECT_EQ(by_name["a"].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(by_name["a"].nbytes, 24u);
  EXPECT_EQ(by_name["b"].dtype, DType::kBF16);
  EXPECT_EQ(by_name["c"].dtype, DType::kF16);
  EXPECT_TRUE(by_name["c"].shape.empty());
  EXPECT_EQ(bytes[by_name["b"].offset], '\2');
  EXPECT_EQ(bytes[by_name["c"].offset + 1], '\3');
  EXPECT_EQ(by_name["a"].offset + 24, by_name["b"].offset);  // sorted writer
}

TEST(SafetensorsTest, TruncatedFiles) {
  auto e = Parse(std::string("\x10\0\0", 3));
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("w.safetensors: truncated"));
  TensorMap m;
  m["a"] = {"F32", {2}, std::string(8, '\0')};
  const std::string full = SafetensorsBytes(m);
  e = Parse(full.substr(0, 20));  // cut inside the header
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("w.safetensors: truncated"));
  e = Parse(full.substr(0, full.size() - 1));  // cut inside the data
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("w.safetensors: tensor 'a'"));
  EXPECT_THAT(e.status().message(), HasSubstr("outside the data region"));
}

TEST(SafetensorsTest, BadHeaderJson) {
  auto e = Parse(SafetensorsFromHeader("{\"a\": {\"dtype\": ", ""));
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("w.safetensors"));
  EXPECT_THAT(e.status().message(), HasSubstr("bad JSON at byte"));
  e = Parse(SafetensorsFromHeader("[1]", ""));
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("not a JSON object"));
}

TEST(SafetensorsTest, UnsupportedDtypeNamesTensor) {
  TensorMap m;
  m["ids"] = {"I64", {2}, std::string(16, '\0')};
  auto e = Parse(SafetensorsBytes(m));
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(
      e.status().message(),
      HasSubstr("w.safetensors: tensor 'ids': unsupported dtype 'I64'"));
}

TEST(SafetensorsTest, OffsetsChecked) {
  const std::string data(16, '\0');
  auto e = Parse(SafetensorsFromHeader(
      R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
      data));
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("tensor 'w'"));
  EXPECT_THAT(e.status().message(), HasSubstr("outside the data region"));
  e = Parse(SafetensorsFromHeader(
      R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})",
      data));
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("tensor 'w'"));
  EXPECT_THAT(e.status().message(), HasSubstr("needs 12"));
  e = Parse(SafetensorsFromHeader(
      R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})",
      data));
  ASSERT_FALSE(e.ok());
  e = Parse(SafetensorsFromHeader(
      R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})",
      data));
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("bad shape"));
  e = Parse(
      SafetensorsFromHeader(R"({"w": {"dtype": "F32", "shape": [1]}})", data));
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("data_offsets"));
}

TEST(SafetensorsTest, MappedFileOpen) {
  const std::string dir = testing::FreshDir("mapped");
  TensorMap m;
  m["x"] = {"F32", {1}, std::string("\0\0\x80\x3f", 4)};
  ASSERT_TRUE(
      testing::WriteFile(dir + "/a.safetensors", SafetensorsBytes(m)).ok());
  auto f = SafetensorsFile::Open(dir + "/a.safetensors");
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ((*f)->entries.size(), 1u);
  float v = 0;
  ToFloat(DType::kF32, (*f)->DataOf((*f)->entries[0]), 1, &v);
  EXPECT_EQ(v, 1.0f);
  ASSERT_TRUE(testing::WriteFile(dir + "/empty.safetensors", "").ok());
  f = SafetensorsFile::Open(dir + "/empty.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("empty.safetensors: truncated"));
  f = SafetensorsFile::Open(dir + "/none.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
}

TEST(ToFloatTest, Bf16IsTopHalfOfF32) {
  const float values[] = {0.0f,
                          -0.0f,
                          1.0f,
                          -2.5f,
                          3.140625f,
                          1e-40f,
                          std::numeric_limits<float>::infinity()};
  for (float f : values) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    const uint16_t b = static_cast<uint16_t>(bits >> 16);
    float out = 0;
    ToFloat(DType::kBF16, &b, 1, &out);
    uint32_t out_bits;
    std::memcpy(&out_bits, &out, 4);
    EXPECT_EQ(out_bits, bits & 0xffff0000u) << f;
  }
  const uint16_t nan = 0x7fc1;
  float out = 0;
  ToFloat(DType::kBF16, &nan, 1, &out);
  EXPECT_TRUE(std::isnan(out));
}

TEST(ToFloatTest, F16AllValuesExact) {
  // Every half value: compare against the defining formula.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t x = static_cast<uint16_t>(h);
    float out = 0;
    ToFloat(DType::kF16, &x, 1, &out);
    const int sign = (x >> 15) ? -1 : 1;
    const int exp = (x >> 10) & 0x1f;
    const int mant = x & 0x3ff;
    if (exp == 0x1f) {
      if (mant == 0) {
        EXPECT_EQ(out, sign * std::numeric_limits<float>::infinity());
      } else {
        EXPECT_TRUE(std::isnan(out)) << h;
      }
      continue;
    }
    const double want = exp == 0 ? sign * std::ldexp(mant, -24)
                                 : sign * std::ldexp(1024 + mant, exp - 25);
    EXPECT_EQ(static_cast<double>(out), want) << h;
    EXPECT_EQ(std::signbit(out), sign < 0) << h;
  }
}

TEST(ToFloatTest, F32CopiesAndUnalignedSource) {
  const float src[3] = {1.5f, -0.25f, 7.0f};
  char buf[13];
  std::memcpy(buf + 1, src, 12);
  float out[3] = {};
  ToFloat(DType::kF32, buf + 1, 3, out);
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -0.25f);
  EXPECT_EQ(out[2], 7.0f);
}

}  // namespace
}  // namespace specserve::model_files
