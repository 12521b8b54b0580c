// FP8 checkpoints (Qwen's block-scaled layout): tests/models/tiny_a_fp8,
// written from tiny_a by tools/fp8_convert, loads with every FP8 matrix
// dequantized to within float8_e4m3fn's rounding of tiny_a's weights; a
// corrupted scale, a missing scale, a wrong block size and FP8 tensors
// without quantization_config each give a load error naming the tensor or
// field.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/model_files/checkpoint.h"
#include "worker/model_files/safetensors.h"
#include "worker/model_files/test_util.h"

namespace specserve::model_files {
namespace {

using testing::FreshDir;
using ::testing::HasSubstr;
using testing::ReadFileOrDie;
using testing::WriteFile;

std::string ModelDir(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/",
                      std::getenv("TEST_WORKSPACE"), "/tests/models/", name);
}

TEST(Fp8Test, E4M3Values) {
  EXPECT_EQ(Fp8E4M3ToFloat(0x00), 0.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x38), 1.0f);    // exp 7, mant 0
  EXPECT_EQ(Fp8E4M3ToFloat(0x7e), 448.0f);  // the largest
  EXPECT_EQ(Fp8E4M3ToFloat(0xfe), -448.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(Fp8E4M3ToFloat(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_TRUE(std::isnan(Fp8E4M3ToFloat(0x7f)));
  EXPECT_TRUE(std::isnan(Fp8E4M3ToFloat(0xff)));
}

// Every FP8 matrix is within half an e4m3 step of the source weight (the
// converter rounds to nearest): the
// step is 2^-3 of the value's binade for normals (relative 2^-4 at worst)
// and 2^-9 x the block scale for subnormals, the scale being the block's
// max |w| / 448.
TEST(Fp8Test, TinyFp8LoadsWithinFp8RoundingOfTheSource) {
  auto fp8 = Checkpoint::Open(ModelDir("tiny_a_fp8"));
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  auto src = Checkpoint::Open(ModelDir("tiny_a"));
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_GT((*fp8)->fp8_tensors(), 0);
  ASSERT_TRUE((*fp8)->config().fp8.has_value());
  // Small blocks, so that the tiny matrices hold several in each direction.
  const int64_t block = (*fp8)->config().fp8->block_rows;
  ASSERT_EQ(block, 16);
  ASSERT_EQ((*fp8)->config().fp8->block_cols, 16);
  int compared = 0;
  for (const TensorSpec& spec : ExpectedTensors((*src)->config())) {
    const Tensor* a = (*src)->Find(spec.name);
    const Tensor* b = (*fp8)->Find(spec.name);
    if (a == nullptr) continue;
    ASSERT_NE(b, nullptr) << spec.name;
    ASSERT_EQ(a->numel(), b->numel()) << spec.name;
    std::vector<float> want(a->numel()), got(b->numel());
    ToFloat(a->dtype, a->data, want.size(), want.data());
    ToFloat(b->dtype, b->data, got.size(), got.data());
    if (want == got) continue;  // not quantized
    ++compared;
    ASSERT_EQ(a->shape.size(), 2u) << spec.name;
    const int64_t rows = a->shape[0], cols = a->shape[1];
    for (int64_t bi = 0; bi < rows; bi += block) {
      for (int64_t bj = 0; bj < cols; bj += block) {
        float amax = 0;
        for (int64_t i = bi; i < std::min(rows, bi + block); ++i) {
          for (int64_t j = bj; j < std::min(cols, bj + block); ++j) {
            amax = std::max(amax, std::fabs(want[i * cols + j]));
          }
        }
        const double scale = amax > 0 ? amax / 448.0 : 1.0;
        for (int64_t i = bi; i < std::min(rows, bi + block); ++i) {
          for (int64_t j = bj; j < std::min(cols, bj + block); ++j) {
            const double w = want[i * cols + j], q = got[i * cols + j];
            const double bound =
                std::max(std::fabs(w) * 0.0625, scale * std::ldexp(1.0, -10)) *
                    (1 + 1e-6) +
                1e-12;
            ASSERT_LE(std::fabs(q - w), bound)
                << spec.name << " [" << i << ", " << j << "]";
          }
        }
      }
    }
  }
  EXPECT_EQ(compared, (*fp8)->fp8_tensors());
}

// A copy of tiny_a_fp8 in a fresh folder with `edit` applied to its tensors
// (stored names) and `edit_config` to its config.json.
std::string BrokenCopy(
    const std::string& name,
    const std::function<void(testing::TensorMap*)>& edit,
    const std::function<void(nlohmann::json*)>& edit_config = nullptr) {
  const std::string src = ModelDir("tiny_a_fp8");
  const std::string dir = FreshDir(name);
  const std::string file = ReadFileOrDie(src + "/model.safetensors");
  auto entries = ParseSafetensors(reinterpret_cast<const uint8_t*>(file.data()),
                                  file.size(), name);
  EXPECT_TRUE(entries.ok()) << entries.status();
  uint64_t header = 0;
  std::memcpy(&header, file.data(), 8);
  testing::TensorMap tensors;
  for (const SafetensorsEntry& e : *entries) {
    testing::TestTensor t;
    t.dtype = e.f8_e4m3                                  ? "F8_E4M3"
              : std::string(DTypeName(e.dtype)) == "f32" ? "F32"
                                                         : "BF16";
    t.shape = e.shape;
    t.bytes = file.substr(e.offset, e.nbytes);
    tensors[e.name] = t;
  }
  edit(&tensors);
  EXPECT_TRUE(
      WriteFile(dir + "/model.safetensors", testing::SafetensorsBytes(tensors))
          .ok());
  nlohmann::json config =
      nlohmann::json::parse(ReadFileOrDie(src + "/config.json"));
  if (edit_config) edit_config(&config);
  EXPECT_TRUE(WriteFile(dir + "/config.json", config.dump()).ok());
  return dir;
}

const char kScaled[] = "model.layers.0.mlp.down_proj.weight";

TEST(Fp8Test, ACopyLoads) {
  // The copy itself is sound: the refusals below are the edits'.
  auto ok = Checkpoint::Open(BrokenCopy("fp8_copy", [](auto*) {}));
  EXPECT_TRUE(ok.ok()) << ok.status();
}

TEST(Fp8Test, CorruptedScaleIsALoadErrorNamingIt) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), 0.0f, -1.0f,
                    std::numeric_limits<float>::infinity()}) {
    const std::string dir = BrokenCopy("fp8_bad_scale", [&](auto* t) {
      std::string& bytes = (*t)[absl::StrCat(kScaled, "_scale_inv")].bytes;
      std::memcpy(bytes.data(), &bad, 4);
    });
    auto ck = Checkpoint::Open(dir);
    ASSERT_FALSE(ck.ok()) << bad;
    EXPECT_EQ(ck.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(ck.status().message()),
                HasSubstr("layers.0.mlp.down_proj.weight_scale_inv"));
    EXPECT_THAT(std::string(ck.status().message()), HasSubstr("block (0, 0)"));
  }
}

TEST(Fp8Test, MissingScaleIsALoadErrorNamingTheTensor) {
  const std::string dir = BrokenCopy("fp8_no_scale", [](auto* t) {
    t->erase(absl::StrCat(kScaled, "_scale_inv"));
  });
  auto ck = Checkpoint::Open(dir);
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(std::string(ck.status().message()),
              HasSubstr("FP8 tensor 'layers.0.mlp.down_proj.weight' has no "
                        "block scale"));
}

TEST(Fp8Test, WrongBlockSizeIsALoadErrorNamingTheScale) {
  const std::string dir = BrokenCopy(
      "fp8_block_64", [](auto*) {},
      [](nlohmann::json* c) {
        (*c)["quantization_config"]["weight_block_size"] = {32, 32};
      });
  auto ck = Checkpoint::Open(dir);
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(std::string(ck.status().message()),
              HasSubstr("weight_block_size [32, 32]"));
  EXPECT_THAT(std::string(ck.status().message()), HasSubstr("_scale_inv"));
}

TEST(Fp8Test, Fp8WithoutQuantizationConfigIsALoadError) {
  const std::string dir = BrokenCopy(
      "fp8_no_config", [](auto*) {},
      [](nlohmann::json* c) { c->erase("quantization_config"); });
  auto ck = Checkpoint::Open(dir);
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(std::string(ck.status().message()),
              HasSubstr("no quantization_config"));
}

TEST(Fp8Test, OtherQuantMethodsAreRefusedNamingTheField) {
  const std::string dir = BrokenCopy(
      "fp8_awq", [](auto*) {},
      [](nlohmann::json* c) {
        (*c)["quantization_config"]["quant_method"] = "awq";
      });
  auto ck = Checkpoint::Open(dir);
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(std::string(ck.status().message()),
              HasSubstr("quantization_config.quant_method"));
}

}  // namespace
}  // namespace specserve::model_files
