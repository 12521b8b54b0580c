#include "worker/model_files/checkpoint.h"

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/model_files/test_util.h"

namespace specserve::model_files {
namespace {

using testing::FreshDir;
using ::testing::HasSubstr;
using testing::TensorMap;
using testing::TinyModelOptions;
using testing::WriteTinyModel;

absl::StatusOr<std::unique_ptr<Checkpoint>> WriteAndOpen(
    const std::string& name, const TinyModelOptions& o,
    const std::function<void(TensorMap*)>& edit = nullptr) {
  const std::string dir = FreshDir(name);
  absl::Status s = WriteTinyModel(dir, o, edit);
  if (!s.ok()) return s;
  return Checkpoint::Open(dir);
}

uint64_t CountParams(const std::vector<TensorSpec>& specs) {
  uint64_t n = 0;
  for (const TensorSpec& s : specs) {
    uint64_t k = 1;
    for (int64_t d : s.shape) k *= d;
    n += k;
  }
  return n;
}

TEST(ExpectedTensorsTest, NamesAndShapes) {
  TinyModelOptions o;
  o.mtp_layers = 1;
  auto c = ParseModelConfig(testing::TinyConfigJson(o), "c");
  ASSERT_TRUE(c.ok()) << c.status();
  std::map<std::string, std::vector<int64_t>> m;
  for (const TensorSpec& s : ExpectedTensors(*c)) m[s.name] = s.shape;
  using V = std::vector<int64_t>;
  // H=16 I=24 V=32; nk=2 nv=4 dk=dv=4 Kc=4; nh=4 nkv=2 hd=8.
  EXPECT_EQ(m["embed_tokens.weight"], (V{32, 16}));
  EXPECT_EQ(m["lm_head.weight"], (V{32, 16}));
  EXPECT_EQ(m["norm.weight"], (V{16}));
  EXPECT_EQ(m["layers.0.input_layernorm.weight"], (V{16}));
  EXPECT_EQ(m["layers.0.post_attention_layernorm.weight"], (V{16}));
  EXPECT_EQ(m["layers.0.mlp.gate_proj.weight"], (V{24, 16}));
  EXPECT_EQ(m["layers.0.mlp.up_proj.weight"], (V{24, 16}));
  EXPECT_EQ(m["layers.0.mlp.down_proj.weight"], (V{16, 24}));
  EXPECT_EQ(m["layers.2.linear_attn.in_proj_qkv.weight"], (V{32, 16}));
  EXPECT_EQ(m["layers.2.linear_attn.in_proj_z.weight"], (V{16, 16}));
  EXPECT_EQ(m["layers.2.linear_attn.in_proj_b.weight"], (V{4, 16}));
  EXPECT_EQ(m["layers.2.linear_attn.in_proj_a.weight"], (V{4, 16}));
  EXPECT_EQ(m["layers.2.linear_attn.conv1d.weight"], (V{32, 1, 4}));
  EXPECT_EQ(m["layers.2.linear_attn.dt_bias"], (V{4}));
  EXPECT_EQ(m["layers.2.linear_attn.A_log"], (V{4}));
  EXPECT_EQ(m["layers.2.linear_attn.norm.weight"], (V{4}));
  EXPECT_EQ(m["layers.2.linear_attn.out_proj.weight"], (V{16, 16}));
  EXPECT_EQ(m["layers.3.self_attn.q_proj.weight"], (V{64, 16}));
  EXPECT_EQ(m["layers.3.self_attn.k_proj.weight"], (V{16, 16}));
  EXPECT_EQ(m["layers.3.self_attn.v_proj.weight"], (V{16, 16}));
  EXPECT_EQ(m["layers.3.self_attn.o_proj.weight"], (V{16, 32}));
  EXPECT_EQ(m["layers.3.self_attn.q_norm.weight"], (V{8}));
  EXPECT_EQ(m["layers.3.self_attn.k_norm.weight"], (V{8}));
  EXPECT_EQ(m["mtp.fc.weight"], (V{16, 32}));
  EXPECT_EQ(m["mtp.pre_fc_norm_embedding.weight"], (V{16}));
  EXPECT_EQ(m["mtp.pre_fc_norm_hidden.weight"], (V{16}));
  EXPECT_EQ(m["mtp.norm.weight"], (V{16}));
  EXPECT_EQ(m["mtp.layers.0.self_attn.q_proj.weight"], (V{64, 16}));
  EXPECT_EQ(m["mtp.layers.0.mlp.down_proj.weight"], (V{16, 24}));
  EXPECT_EQ(m["mtp.layers.0.input_layernorm.weight"], (V{16}));
  // 3 linear layers x 14 + 1 full x 11 + 3 + MTP (4 + 11).
  EXPECT_EQ(m.size(), 3u * 14 + 11 + 3 + 4 + 11);
  EXPECT_EQ(m.count("layers.0.self_attn.q_proj.weight"), 0u);
  EXPECT_EQ(m.count("layers.3.linear_attn.A_log"), 0u);
}

TEST(CheckpointTest, OpensValidSingleFile) {
  TinyModelOptions o;
  auto ck = WriteAndOpen("single", o);
  ASSERT_TRUE(ck.ok()) << ck.status();
  const Checkpoint& c = **ck;
  EXPECT_FALSE(c.config().tie_word_embeddings);
  EXPECT_FALSE(c.has_mtp());
  EXPECT_EQ(c.dtype(), DType::kBF16);
  const std::vector<TensorSpec> specs = ExpectedTensors(c.config());
  EXPECT_EQ(c.parameter_count(), CountParams(specs));
  EXPECT_EQ(c.weight_bytes(), 2 * CountParams(specs));
  const Tensor& t = c.Get("layers.1.linear_attn.A_log");
  EXPECT_EQ(t.name, "layers.1.linear_attn.A_log");
  EXPECT_EQ(t.dtype, DType::kBF16);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(t.numel(), 4);
  EXPECT_EQ(t.nbytes, 8u);
  ASSERT_NE(c.Find("lm_head.weight"), nullptr);
  EXPECT_EQ(c.Find("model.embed_tokens.weight"), nullptr);
  // The data is what the writer stored.
  TensorMap want = testing::TinyModelTensors(c.config(), o);
  const std::string& bytes = want["model.layers.1.linear_attn.A_log"].bytes;
  EXPECT_EQ(std::string(static_cast<const char*>(t.data), t.nbytes), bytes);
}

TEST(CheckpointTest, OpensShardedWithIndex) {
  TinyModelOptions o;
  o.num_shards = 3;
  o.dtype = "F32";
  auto ck = WriteAndOpen("sharded", o);
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ((*ck)->dtype(), DType::kF32);
  EXPECT_NE((*ck)->Find("layers.3.self_attn.k_norm.weight"), nullptr);
  EXPECT_EQ((*ck)->weight_bytes(),
            4 * CountParams(ExpectedTensors((*ck)->config())));
}

TEST(CheckpointTest, StripsLanguageModelPrefixAndIgnoresVisual) {
  TinyModelOptions o;
  o.prefix = "model.language_model.";
  o.nest_text_config = true;
  o.add_visual = true;
  auto ck = WriteAndOpen("lm_prefix", o);
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ((*ck)->config().architecture, "Qwen3_5ForConditionalGeneration");
  EXPECT_NE((*ck)->Find("embed_tokens.weight"), nullptr);
  EXPECT_EQ((*ck)->Find("visual.blocks.0.attn.qkv.weight"), nullptr);
  EXPECT_EQ((*ck)->parameter_count(),
            CountParams(ExpectedTensors((*ck)->config())));
}

TEST(CheckpointTest, TiedAndUntiedLmHead) {
  TinyModelOptions o;
  o.tied = true;
  auto tied = WriteAndOpen("tied", o);
  ASSERT_TRUE(tied.ok()) << tied.status();
  EXPECT_TRUE((*tied)->config().tie_word_embeddings);
  EXPECT_EQ((*tied)->Find("lm_head.weight"), nullptr);
  // Untied config, but the files have no lm_head: the embedding is used.
  o.tied = false;
  o.write_lm_head = false;
  auto absent = WriteAndOpen("no_lm_head", o);
  ASSERT_TRUE(absent.ok()) << absent.status();
  EXPECT_TRUE((*absent)->config().tie_word_embeddings);
  EXPECT_EQ((*absent)->parameter_count(), (*tied)->parameter_count());
  o.write_lm_head = true;
  auto untied = WriteAndOpen("untied", o);
  ASSERT_TRUE(untied.ok()) << untied.status();
  EXPECT_FALSE((*untied)->config().tie_word_embeddings);
  EXPECT_EQ((*untied)->parameter_count(), (*tied)->parameter_count() + 32 * 16);
  // Tied config with a stray lm_head.weight: it is not used.
  o.tied = true;
  auto stray = WriteAndOpen("tied_stray", o, [](TensorMap* m) {
    (*m)["lm_head.weight"] = {"BF16", {32, 16}, std::string(1024, '\0')};
  });
  ASSERT_TRUE(stray.ok()) << stray.status();
  EXPECT_EQ((*stray)->Find("lm_head.weight"), nullptr);
}

TEST(CheckpointTest, LayerTypesFromInterval) {
  TinyModelOptions o;
  o.use_interval = true;  // interval 2: layers 1 and 3 are full attention
  auto ck = WriteAndOpen("interval", o);
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ((*ck)->config().num_full_attention_layers(), 2);
  EXPECT_NE((*ck)->Find("layers.1.self_attn.q_proj.weight"), nullptr);
  EXPECT_NE((*ck)->Find("layers.2.linear_attn.A_log"), nullptr);
}

TEST(CheckpointTest, MtpPresent) {
  TinyModelOptions o;
  o.mtp_layers = 1;
  auto ck = WriteAndOpen("mtp", o);
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_TRUE((*ck)->has_mtp());
  EXPECT_NE((*ck)->Find("mtp.layers.0.self_attn.q_norm.weight"), nullptr);
  EXPECT_EQ((*ck)->parameter_count(),
            CountParams(ExpectedTensors((*ck)->config())));
  // "model.mtp.*" is accepted too.
  o.mtp_prefix = "model.";
  auto ck2 = WriteAndOpen("mtp_model_prefix", o);
  ASSERT_TRUE(ck2.ok()) << ck2.status();
  EXPECT_TRUE((*ck2)->has_mtp());
  EXPECT_NE((*ck2)->Find("mtp.fc.weight"), nullptr);
}

TEST(CheckpointTest, MtpAbsentIsAWarningNotAnError) {
  TinyModelOptions o;
  o.mtp_layers = 1;
  o.write_mtp = false;
  auto ck = WriteAndOpen("mtp_absent", o);
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_FALSE((*ck)->has_mtp());
  TinyModelOptions plain;
  auto base = WriteAndOpen("mtp_absent_base", plain);
  ASSERT_TRUE(base.ok());
  EXPECT_EQ((*ck)->parameter_count(), (*base)->parameter_count());
}

TEST(CheckpointTest, MtpPartialIsAnError) {
  TinyModelOptions o;
  o.mtp_layers = 1;
  auto ck = WriteAndOpen("mtp_partial", o, [](TensorMap* m) {
    m->erase("mtp.layers.0.mlp.up_proj.weight");
  });
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(ck.status().message(),
              HasSubstr("model.safetensors: missing tensor "
                        "'mtp.layers.0.mlp.up_proj.weight'"));
}

TEST(CheckpointTest, MissingTensor) {
  auto ck = WriteAndOpen("missing", TinyModelOptions(), [](TensorMap* m) {
    m->erase("model.layers.2.linear_attn.A_log");
  });
  ASSERT_FALSE(ck.ok());
  EXPECT_EQ(ck.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ck.status().message(),
              HasSubstr("missing/model.safetensors: missing tensor "
                        "'layers.2.linear_attn.A_log'"));
}

TEST(CheckpointTest, WrongShapeNamesTensorShapesAndFile) {
  TinyModelOptions o;
  o.num_shards = 2;
  auto ck = WriteAndOpen("wrong_shape", o, [](TensorMap* m) {
    (*m)["model.layers.3.self_attn.k_proj.weight"] = {
        "BF16", {8, 16}, std::string(256, '\0')};
  });
  ASSERT_FALSE(ck.ok());
  const std::string msg(ck.status().message());
  EXPECT_THAT(msg, HasSubstr("tensor 'layers.3.self_attn.k_proj.weight' has "
                             "shape [8, 16], expected [16, 16]"));
  EXPECT_THAT(msg, HasSubstr("wrong_shape/model-0000"));
  EXPECT_THAT(msg, HasSubstr(".safetensors"));
}

TEST(CheckpointTest, BrokenWeightFiles) {
  const std::string dir = FreshDir("broken");
  ASSERT_TRUE(WriteTinyModel(dir, TinyModelOptions()).ok());
  const std::string path = dir + "/model.safetensors";
  const std::string good = testing::ReadFileOrDie(path);
  struct Case {
    std::string bytes;
    std::string want;
  };
  const Case cases[] = {
      {good.substr(0, 100), "model.safetensors: truncated"},
      {good.substr(0, good.size() - 3), "outside the data region"},
      {testing::SafetensorsFromHeader("{\"x\": [", ""), "bad JSON at byte"},
      {testing::SafetensorsFromHeader(
           R"({"model.norm.weight": {"dtype": "F64", "shape": [16],
              "data_offsets": [0, 128]}})",
           std::string(128, '\0')),
       "tensor 'model.norm.weight': unsupported dtype 'F64'"},
      {testing::SafetensorsFromHeader(
           R"({"model.norm.weight": {"dtype": "F32", "shape": [16],
              "data_offsets": [64, 128]}})",
           std::string(64, '\0')),
       "tensor 'model.norm.weight': data_offsets [64, 128] outside"},
  };
  for (const Case& c : cases) {
    ASSERT_TRUE(testing::WriteFile(path, c.bytes).ok());
    auto ck = Checkpoint::Open(dir);
    ASSERT_FALSE(ck.ok()) << c.want;
    EXPECT_THAT(ck.status().message(), HasSubstr(path)) << c.want;
    EXPECT_THAT(ck.status().message(), HasSubstr(c.want));
  }
}

TEST(CheckpointTest, MissingShard) {
  TinyModelOptions o;
  o.num_shards = 2;
  const std::string dir = FreshDir("missing_shard");
  ASSERT_TRUE(WriteTinyModel(dir, o).ok());
  std::filesystem::remove(dir + "/model-00002-of-00002.safetensors");
  auto ck = Checkpoint::Open(dir);
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(ck.status().message(),
              HasSubstr("model.safetensors.index.json: shard file "
                        "'model-00002-of-00002.safetensors' missing"));
}

TEST(CheckpointTest, ConfigErrors) {
  const std::string dir = FreshDir("bad_config");
  ASSERT_TRUE(WriteTinyModel(dir, TinyModelOptions()).ok());
  ASSERT_TRUE(
      testing::WriteFile(dir + "/config.json", "{\"vocab_size\": 3,").ok());
  auto ck = Checkpoint::Open(dir);
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(ck.status().message(), HasSubstr(dir + "/config.json"));
  EXPECT_THAT(ck.status().message(), HasSubstr("bad JSON at byte"));
  ASSERT_TRUE(
      testing::WriteFile(dir + "/config.json", "{\"vocab_size\": 3}").ok());
  ck = Checkpoint::Open(dir);
  ASSERT_FALSE(ck.ok());
  EXPECT_EQ(ck.status().message(),
            dir + "/config.json: field 'hidden_size' missing");
}

TEST(CheckpointTest, NoWeights) {
  const std::string dir = FreshDir("no_weights");
  ASSERT_TRUE(WriteTinyModel(dir, TinyModelOptions()).ok());
  std::filesystem::remove(dir + "/model.safetensors");
  auto ck = Checkpoint::Open(dir);
  ASSERT_FALSE(ck.ok());
  EXPECT_EQ(ck.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ck.status().message(), HasSubstr("model.safetensors"));
}

}  // namespace
}  // namespace specserve::model_files
