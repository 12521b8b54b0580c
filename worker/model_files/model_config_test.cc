#include "worker/model_files/model_config.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specserve::model_files {
namespace {

using ::testing::HasSubstr;

// A complete top-level config; tests splice extra fields in front.
std::string Config(const std::string& extra = "",
                   const std::string& drop = "") {
  std::string fields[] = {
      R"("vocab_size": 32)",
      R"("hidden_size": 16)",
      R"("intermediate_size": 24)",
      R"("num_hidden_layers": 4)",
      R"("num_attention_heads": 4)",
      R"("num_key_value_heads": 2)",
      R"("head_dim": 8)",
      R"("linear_num_key_heads": 2)",
      R"("linear_num_value_heads": 4)",
      R"("linear_key_head_dim": 4)",
      R"("linear_value_head_dim": 4)",
      R"("linear_conv_kernel_dim": 4)",
  };
  std::string out = "{" + extra;
  bool first = true;  // `extra` ends with its own comma
  for (const std::string& f : fields) {
    if (!drop.empty() && f.find("\"" + drop + "\"") == 0) continue;
    if (!first) out += ", ";
    out += f;
    first = false;
  }
  return out + "}";
}

TEST(ModelConfigTest, ParsesTopLevelFieldsAndDefaults) {
  auto c = ParseModelConfig(
      Config(R"("architectures": ["Qwen3_5ForCausalLM"], "model_type":
      "qwen3_5_text", "eos_token_id": 7, "rms_norm_eps": 1e-5,)"),
      "x/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "Qwen3_5ForCausalLM");
  EXPECT_EQ(c->model_type, "qwen3_5_text");
  EXPECT_EQ(c->vocab_size, 32);
  EXPECT_EQ(c->hidden_size, 16);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->mtp_num_hidden_layers, 0);
  EXPECT_EQ(c->mamba_ssm_dtype, "");
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(c->partial_rotary_factor, 0.25);
  EXPECT_EQ(c->rotary_dim(), 2);
  EXPECT_EQ(c->eos_token_ids, std::vector<int>{7});
  EXPECT_EQ(c->key_dim(), 8);
  EXPECT_EQ(c->value_dim(), 16);
  EXPECT_EQ(c->conv_dim(), 32);
  // Default interval 4: layer 3 is the only full-attention layer.
  ASSERT_EQ(c->layer_types.size(), 4u);
  EXPECT_EQ(c->layer_types[3], LayerType::kFullAttention);
  EXPECT_EQ(c->num_full_attention_layers(), 1);
}

TEST(ModelConfigTest, LayerTypesFromInterval) {
  auto c = ParseModelConfig(Config(R"("full_attention_interval": 2,)"), "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->layer_types,
            (std::vector<LayerType>{
                LayerType::kLinearAttention, LayerType::kFullAttention,
                LayerType::kLinearAttention, LayerType::kFullAttention}));
}

TEST(ModelConfigTest, ExplicitLayerTypes) {
  auto c = ParseModelConfig(
      Config(R"("layer_types": ["full_attention", "linear_attention",
      "linear_attention", "full_attention"],)"),
      "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->layer_types[0], LayerType::kFullAttention);
  EXPECT_EQ(c->layer_types[1], LayerType::kLinearAttention);
  EXPECT_EQ(c->num_full_attention_layers(), 2);
}

TEST(ModelConfigTest, MambaSsmDtypeIsReadAsWritten) {
  auto c = ParseModelConfig(
      R"({"text_config": )" + Config(R"("mamba_ssm_dtype": "float32",)") + "}",
      "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mamba_ssm_dtype, "float32");
  auto bad = ParseModelConfig(Config(R"("mamba_ssm_dtype": 32,)"), "c");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("mamba_ssm_dtype"));
}

TEST(ModelConfigTest, TextConfigWinsOverTopLevel) {
  std::string text = Config(R"("tie_word_embeddings": true,
      "mtp_num_hidden_layers": 1, "eos_token_id": [3, 5], "model_type":
      "qwen3_5_text", "rope_parameters": {"rope_theta": 5e6,
      "partial_rotary_factor": 0.5, "mrope_section": [1, 1, 0]},)");
  auto c = ParseModelConfig(
      R"({"architectures": ["Qwen3_5ForConditionalGeneration"],
          "model_type": "qwen3_5", "hidden_size": 999,
          "tie_word_embeddings": false, "text_config": )" +
          text + "}",
      "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "Qwen3_5ForConditionalGeneration");
  EXPECT_EQ(c->model_type, "qwen3_5_text");
  EXPECT_EQ(c->hidden_size, 16);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->mtp_num_hidden_layers, 1);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{3, 5}));
  EXPECT_DOUBLE_EQ(c->rope_theta, 5e6);
  EXPECT_EQ(c->rotary_dim(), 4);
}

TEST(ModelConfigTest, OlderTopLevelRopeFieldsAndNulls) {
  auto c = ParseModelConfig(
      Config(R"("rope_theta": 1e6, "partial_rotary_factor": 0.5,
      "eos_token_id": null, "mtp_num_hidden_layers": null,)"),
      "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c->partial_rotary_factor, 0.5);
  EXPECT_TRUE(c->eos_token_ids.empty());
  EXPECT_EQ(c->mtp_num_hidden_layers, 0);
}

TEST(ModelConfigTest, HeadDimDefaultsLikeTransformers) {
  // Qwen3_5TextConfig's default head_dim is 256, not hidden / heads.
  auto c = ParseModelConfig(Config("", "head_dim"), "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_EQ(c->rotary_dim(), 64);
}

TEST(ModelConfigTest, MissingFieldNamesFileAndField) {
  auto c = ParseModelConfig(Config("", "hidden_size"), "tests/x/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(),
            "tests/x/config.json: field 'hidden_size' missing");
}

TEST(ModelConfigTest, NonPositiveAndWrongTypeFields) {
  auto c = ParseModelConfig(Config(R"("vocab_size": 0,)", "vocab_size"), "f");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("f: field 'vocab_size'"));
  c = ParseModelConfig(Config(R"("vocab_size": "32",)", "vocab_size"), "f");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("'vocab_size'"));
  c = ParseModelConfig(Config(R"("tie_word_embeddings": 1,)"), "f");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("'tie_word_embeddings'"));
  c = ParseModelConfig(Config(R"("eos_token_id": ["a"],)"), "f");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("'eos_token_id'"));
}

TEST(ModelConfigTest, BadJsonNamesFileAndPosition) {
  auto c = ParseModelConfig("{\"vocab_size\": 32,\n \"hidden_size\": }",
                            "tests/x/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("tests/x/config.json"));
  EXPECT_THAT(c.status().message(), HasSubstr("at byte 36"));
  EXPECT_THAT(c.status().message(), HasSubstr("line 2, column 17"));
  c = ParseModelConfig("[1, 2]", "f.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("f.json"));
}

TEST(ModelConfigTest, LayerTypesValidated) {
  auto c = ParseModelConfig(
      Config(R"("layer_types": ["linear_attention", "full_attention"],)"), "f");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("f: field 'layer_types'"));
  EXPECT_THAT(c.status().message(), HasSubstr("2 entries"));
  c = ParseModelConfig(
      Config(R"("layer_types": ["linear_attention", "sliding_attention",
      "linear_attention", "full_attention"],)"),
      "f");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("sliding_attention"));
}

TEST(ModelConfigTest, HeadDivisibilityAndRotaryDim) {
  auto c = ParseModelConfig(
      Config(R"("num_key_value_heads": 3,)", "num_key_value_heads"), "f");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("'num_key_value_heads'"));
  c = ParseModelConfig(
      Config(R"("linear_num_key_heads": 3,)", "linear_num_key_heads"), "f");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("'linear_num_key_heads'"));
  // 8 * 0.125 = 1 rotated dim: odd.
  c = ParseModelConfig(Config(R"("partial_rotary_factor": 0.125,)"), "f");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("'partial_rotary_factor'"));
  c = ParseModelConfig(
      Config(R"("rope_parameters": {"partial_rotary_factor": 1.5},)"), "f");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("'partial_rotary_factor'"));
}

TEST(ModelConfigTest, LoadMissingFileIsNotFound) {
  auto c = LoadModelConfig("/nonexistent/dir");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("/nonexistent/dir/config.json"));
}

// Regression inputs the config fuzzer found (tools/fuzz/crashes/model_files):
// each is refused with INVALID_ARGUMENT naming the field.
TEST(ModelConfigTest, RefusesValuesThatOverflowWhatTheyAreStoredIn) {
  struct Case {
    std::string extra, drop, field;
  };
  for (const Case& c : std::vector<Case>{
           // 1e-60 is 0 as a float, 1e300 inf.
           {R"("rms_norm_eps": 1e-60,)", "", "rms_norm_eps"},
           {R"("rms_norm_eps": 1e300,)", "", "rms_norm_eps"},
           // key_dim = heads x head dim past int.
           {R"("linear_num_key_heads": 1073741824, "linear_num_value_heads":
               1073741824,)",
            "linear_num_key_heads", "linear_num_key_heads"},
           // A 2^30-entry layer list is never built.
           {R"("num_hidden_layers": 1073741824,)", "num_hidden_layers",
            "num_hidden_layers"},
       }) {
    std::string text = Config(c.extra, c.drop);
    if (c.field == "linear_num_key_heads") {
      // (both head counts replaced)
      text = Config(c.extra, "linear_num_value_heads");
      const std::string dup = R"("linear_num_key_heads": 2, )";
      text.erase(text.find(dup), dup.size());
    }
    auto parsed = ParseModelConfig(text, "c");
    ASSERT_FALSE(parsed.ok()) << c.extra;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(c.field));
  }
}

}  // namespace
}  // namespace specserve::model_files
