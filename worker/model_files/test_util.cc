#include "worker/model_files/test_util.h"

#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "worker/model_files/checkpoint.h"

namespace specserve::model_files::testing {

using nlohmann::json;

std::string SafetensorsFromHeader(const std::string& header_json,
                                  const std::string& data) {
  std::string header = header_json;
  while (header.size() % 8 != 0) header.push_back(' ');
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string SafetensorsBytes(const TensorMap& tensors) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::string data;
  for (const auto& [name, t] : tensors) {
    header[name] = {
        {"dtype", t.dtype},
        {"shape", t.shape},
        {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  return SafetensorsFromHeader(header.dump(), data);
}

absl::Status WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), bytes.size());
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) std::abort();
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string TinyConfigJson(const TinyModelOptions& o) {
  json text = {
      {"vocab_size", 32},
      {"hidden_size", 16},
      {"intermediate_size", 24},
      {"num_hidden_layers", 4},
      {"num_attention_heads", 4},
      {"num_key_value_heads", 2},
      {"head_dim", 8},
      {"linear_num_key_heads", 2},
      {"linear_num_value_heads", 4},
      {"linear_key_head_dim", 4},
      {"linear_value_head_dim", 4},
      {"linear_conv_kernel_dim", 4},
      {"rms_norm_eps", 1e-6},
      {"max_position_embeddings", 256},
      {"tie_word_embeddings", o.tied},
      {"rope_parameters",
       {{"rope_type", "default"},
        {"rope_theta", 10000000.0},
        {"partial_rotary_factor", 0.25}}},
      {"eos_token_id", 31},
      {"model_type", "qwen3_5_text"},
  };
  if (o.mtp_layers > 0) text["mtp_num_hidden_layers"] = o.mtp_layers;
  if (o.use_interval) {
    text["full_attention_interval"] = 2;
  } else {
    text["layer_types"] = {"linear_attention", "linear_attention",
                           "linear_attention", "full_attention"};
  }
  json root;
  if (o.nest_text_config) {
    root = {{"architectures", {"Qwen3_5ForConditionalGeneration"}},
            {"model_type", "qwen3_5"},
            {"tie_word_embeddings", o.tied},
            {"text_config", text}};
  } else {
    root = text;
    root["architectures"] = {"Qwen3_5ForCausalLM"};
  }
  return root.dump(2);
}

TensorMap TinyModelTensors(const ModelConfig& config,
                           const TinyModelOptions& o) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> dist(-0.5f, 0.5f);
  ModelConfig c = config;
  c.tie_word_embeddings = o.tied || !o.write_lm_head;
  TensorMap out;
  for (const TensorSpec& spec : ExpectedTensors(c)) {
    const bool mtp = absl::StartsWith(spec.name, "mtp.");
    if (mtp && !o.write_mtp) continue;
    TestTensor t;
    t.dtype = o.dtype;
    t.shape = spec.shape;
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    for (int64_t i = 0; i < n; ++i) {
      const float f = dist(rng);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      if (o.dtype == "F32") {
        t.bytes.append(reinterpret_cast<const char*>(&bits), 4);
      } else {  // BF16 by truncation; F16 gets arbitrary finite halves
        uint16_t h = o.dtype == "BF16" ? static_cast<uint16_t>(bits >> 16)
                                       : static_cast<uint16_t>(bits & 0x3bff);
        t.bytes.append(reinterpret_cast<const char*>(&h), 2);
      }
    }
    std::string name;
    if (spec.name == "lm_head.weight") {
      name = spec.name;
    } else if (mtp) {
      name = o.mtp_prefix + spec.name;
    } else {
      name = o.prefix + spec.name;
    }
    out[name] = std::move(t);
  }
  if (o.add_visual) {
    out["model.visual.blocks.0.attn.qkv.weight"] = {
        "F32", {2, 2}, std::string(16, '\0')};
  }
  return out;
}

absl::Status WriteTinyModel(const std::string& dir, const TinyModelOptions& o,
                            const std::function<void(TensorMap*)>& edit) {
  const std::string config_json = TinyConfigJson(o);
  absl::StatusOr<ModelConfig> config = ParseModelConfig(config_json, "tiny");
  if (!config.ok()) return config.status();
  if (absl::Status s = WriteFile(dir + "/config.json", config_json); !s.ok()) {
    return s;
  }
  TensorMap tensors = TinyModelTensors(*config, o);
  if (edit) edit(&tensors);
  if (o.num_shards <= 1) {
    return WriteFile(dir + "/model.safetensors", SafetensorsBytes(tensors));
  }
  std::vector<TensorMap> shards(o.num_shards);
  json weight_map = json::object();
  int i = 0;
  for (auto& [name, t] : tensors) {
    const int k = i++ % o.num_shards;
    const std::string file = absl::StrCat("model-0000", k + 1, "-of-0000",
                                          o.num_shards, ".safetensors");
    weight_map[name] = file;
    shards[k][name] = t;
  }
  for (int k = 0; k < o.num_shards; ++k) {
    const std::string file = absl::StrCat("model-0000", k + 1, "-of-0000",
                                          o.num_shards, ".safetensors");
    if (absl::Status s =
            WriteFile(dir + "/" + file, SafetensorsBytes(shards[k]));
        !s.ok()) {
      return s;
    }
  }
  json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
  return WriteFile(dir + "/model.safetensors.index.json", index.dump(2));
}

}  // namespace specserve::model_files::testing
