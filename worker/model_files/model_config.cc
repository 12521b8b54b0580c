#include "worker/model_files/model_config.h"

#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "worker/model_files/json_util.h"

namespace specserve::model_files {
namespace {

using nlohmann::json;

// Looks fields up in "text_config" first, then at top level. A JSON null
// counts as absent (transformers writes e.g. "eos_token_id": null).
class FieldReader {
 public:
  FieldReader(const json& root, std::string source)
      : root_(root), source_(std::move(source)) {
    auto it = root_.find("text_config");
    if (it != root_.end() && it->is_object()) text_ = &*it;
  }

  const json* Find(const std::string& name) const {
    for (const json* obj : {text_, &root_}) {
      if (obj == nullptr) continue;
      auto it = obj->find(name);
      if (it != obj->end() && !it->is_null()) return &*it;
    }
    return nullptr;
  }

  absl::Status Missing(const std::string& name) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": field '", name, "' missing"));
  }
  absl::Status Bad(const std::string& name, const std::string& why) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": field '", name, "' ", why));
  }

  // A required integer > 0.
  absl::Status PositiveInt(const std::string& name, int* out) const {
    const json* v = Find(name);
    if (v == nullptr) return Missing(name);
    return ToPositiveInt(name, *v, out);
  }
  // An optional integer > 0; `out` keeps its value when absent.
  absl::Status OptionalPositiveInt(const std::string& name, int* out) const {
    const json* v = Find(name);
    return v == nullptr ? absl::OkStatus() : ToPositiveInt(name, *v, out);
  }
  absl::Status ToPositiveInt(const std::string& name, const json& v,
                             int* out) const {
    int64_t x = 0;
    if (!JsonToInt64(v, &x) || x <= 0 || x > (int64_t{1} << 30)) {
      return Bad(name,
                 absl::StrCat("must be a positive integer, got ", v.dump()));
    }
    *out = static_cast<int>(x);
    return absl::OkStatus();
  }
  // An optional number; `out` keeps its value when absent.
  absl::Status OptionalNumber(const std::string& name, const json& obj,
                              double* out) const {
    auto it = obj.find(name);
    if (it == obj.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_number() || !std::isfinite(it->get<double>())) {
      return Bad(name, absl::StrCat("must be a number, got ", it->dump()));
    }
    *out = it->get<double>();
    return absl::OkStatus();
  }

  const json& root() const { return root_; }
  const json* text() const { return text_; }

 private:
  const json& root_;
  const json* text_ = nullptr;
  std::string source_;
};

// Bounds that keep every size the loader derives from the config (layer
// lists, projection widths) within int.
constexpr int kMaxLayers = 4096;
constexpr int64_t kMaxDim = int64_t{1} << 24;

absl::Status ParseLayerTypes(const FieldReader& r, ModelConfig* c) {
  if (c->num_hidden_layers > kMaxLayers) {
    return r.Bad("num_hidden_layers",
                 absl::StrCat("(", c->num_hidden_layers, ") must be at most ",
                              kMaxLayers));
  }
  const json* lt = r.Find("layer_types");
  if (lt != nullptr) {
    if (!lt->is_array()) return r.Bad("layer_types", "must be a list");
    for (const json& v : *lt) {
      std::string s = v.is_string() ? v.get<std::string>() : v.dump();
      // Legacy names as transformers' remap_legacy_layer_types maps them.
      if (s == "linear_attention" || s == "mamba" || s == "conv") {
        c->layer_types.push_back(LayerType::kLinearAttention);
      } else if (s == "full_attention" || s == "attention") {
        c->layer_types.push_back(LayerType::kFullAttention);
      } else {
        return r.Bad("layer_types",
                     absl::StrCat("has unknown layer type '", s, "'"));
      }
    }
    if (static_cast<int>(c->layer_types.size()) != c->num_hidden_layers) {
      return r.Bad("layer_types",
                   absl::StrCat("has ", c->layer_types.size(),
                                " entries, num_hidden_layers is ",
                                c->num_hidden_layers));
    }
    return absl::OkStatus();
  }
  int interval = 4;
  if (absl::Status s =
          r.OptionalPositiveInt("full_attention_interval", &interval);
      !s.ok()) {
    return s;
  }
  for (int i = 0; i < c->num_hidden_layers; ++i) {
    c->layer_types.push_back((i + 1) % interval == 0
                                 ? LayerType::kFullAttention
                                 : LayerType::kLinearAttention);
  }
  return absl::OkStatus();
}

absl::Status ParseRope(const FieldReader& r, ModelConfig* c) {
  // Older configs: top-level (or text_config-level) fields.
  for (const json* obj : {&r.root(), r.text()}) {
    if (obj == nullptr) continue;
    if (absl::Status s = r.OptionalNumber("rope_theta", *obj, &c->rope_theta);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = r.OptionalNumber("partial_rotary_factor", *obj,
                                          &c->partial_rotary_factor);
        !s.ok()) {
      return s;
    }
  }
  // rope_parameters wins over the older fields.
  if (const json* rp = r.Find("rope_parameters"); rp != nullptr) {
    if (!rp->is_object()) return r.Bad("rope_parameters", "must be an object");
    if (absl::Status s = r.OptionalNumber("rope_theta", *rp, &c->rope_theta);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = r.OptionalNumber("partial_rotary_factor", *rp,
                                          &c->partial_rotary_factor);
        !s.ok()) {
      return s;
    }
  }
  if (!(c->rope_theta > 0)) return r.Bad("rope_theta", "must be positive");
  if (!(c->partial_rotary_factor > 0 && c->partial_rotary_factor <= 1)) {
    return r.Bad("partial_rotary_factor", "must be in (0, 1]");
  }
  return absl::OkStatus();
}

// "quantization_config": absent for bf16/f16/f32 checkpoints; quant_method
// "fp8" with a positive 2-element weight_block_size, activation_scheme
// "dynamic" (or absent) and an optional list modules_to_not_convert.
absl::Status ParseQuantization(const FieldReader& r, ModelConfig* c) {
  const json* q = r.Find("quantization_config");
  if (q == nullptr) return absl::OkStatus();
  const std::string field = "quantization_config";
  if (!q->is_object()) return r.Bad(field, "must be an object");
  auto method = q->find("quant_method");
  if (method == q->end() || !method->is_string()) {
    return r.Bad(field + ".quant_method", "missing (only \"fp8\" is read)");
  }
  if (method->get<std::string>() != "fp8") {
    return r.Bad(field + ".quant_method",
                 absl::StrCat("is \"", method->get<std::string>(),
                              "\"; only \"fp8\" (Qwen's block-scaled FP8) is "
                              "supported"));
  }
  Fp8Quantization fp8;
  auto block = q->find("weight_block_size");
  if (block == q->end() || !block->is_array() || block->size() != 2) {
    return r.Bad(field + ".weight_block_size",
                 "must be [rows, columns] (Qwen's FP8 uses [128, 128])");
  }
  int64_t rows = 0, cols = 0;
  if (!JsonToInt64((*block)[0], &rows) || !JsonToInt64((*block)[1], &cols) ||
      rows <= 0 || cols <= 0 || rows > 4096 || cols > 4096) {
    return r.Bad(field + ".weight_block_size",
                 "must hold two integers in 1..4096");
  }
  fp8.block_rows = static_cast<int>(rows);
  fp8.block_cols = static_cast<int>(cols);
  auto scheme = q->find("activation_scheme");
  if (scheme != q->end() && !scheme->is_null() &&
      (!scheme->is_string() || scheme->get<std::string>() != "dynamic")) {
    return r.Bad(field + ".activation_scheme",
                 "must be \"dynamic\" (static activation scales are not "
                 "supported)");
  }
  auto skip = q->find("modules_to_not_convert");
  if (skip != q->end() && !skip->is_null()) {
    if (!skip->is_array()) {
      return r.Bad(field + ".modules_to_not_convert", "must be a list");
    }
    for (const json& m : *skip) {
      if (!m.is_string()) {
        return r.Bad(field + ".modules_to_not_convert",
                     "must be a list of module names");
      }
      fp8.modules_to_not_convert.push_back(m.get<std::string>());
    }
  }
  c->fp8 = std::move(fp8);
  return absl::OkStatus();
}

absl::Status ParseFields(const FieldReader& r, ModelConfig* c) {
  auto arch = r.root().find("architectures");
  if (r.text() != nullptr) {
    auto t = r.text()->find("architectures");
    if (t != r.text()->end() && t->is_array() && !t->empty()) arch = t;
  }
  if (arch != r.root().end() && arch->is_array() && !arch->empty() &&
      (*arch)[0].is_string()) {
    c->architecture = (*arch)[0].get<std::string>();
  }
  if (const json* mt = r.Find("model_type"); mt != nullptr && mt->is_string()) {
    c->model_type = mt->get<std::string>();
  }

  struct IntField {
    const char* name;
    int* dst;
  };
  for (const IntField& f : {
           IntField{"vocab_size", &c->vocab_size},
           IntField{"hidden_size", &c->hidden_size},
           IntField{"intermediate_size", &c->intermediate_size},
           IntField{"num_hidden_layers", &c->num_hidden_layers},
           IntField{"num_attention_heads", &c->num_attention_heads},
           IntField{"num_key_value_heads", &c->num_key_value_heads},
           IntField{"linear_num_key_heads", &c->linear_num_key_heads},
           IntField{"linear_num_value_heads", &c->linear_num_value_heads},
           IntField{"linear_key_head_dim", &c->linear_key_head_dim},
           IntField{"linear_value_head_dim", &c->linear_value_head_dim},
           IntField{"linear_conv_kernel_dim", &c->linear_conv_kernel_dim},
       }) {
    if (absl::Status s = r.PositiveInt(f.name, f.dst); !s.ok()) return s;
  }
  // transformers' Qwen3_5TextConfig defaults head_dim to 256 (not H / nh)
  // and max_position_embeddings to 32768.
  c->head_dim = 256;
  c->max_position_embeddings = 32768;
  if (absl::Status s = r.OptionalPositiveInt("head_dim", &c->head_dim);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = r.OptionalPositiveInt("max_position_embeddings",
                                             &c->max_position_embeddings);
      !s.ok()) {
    return s;
  }
  if (const json* v = r.Find("rms_norm_eps"); v != nullptr) {
    // Checked as the float it is stored as: 1e-60 would be 0, 1e300 inf.
    const float eps =
        v->is_number() ? static_cast<float>(v->get<double>()) : 0.0f;
    if (!(eps > 0) || !std::isfinite(eps)) {
      return r.Bad("rms_norm_eps", "must be a positive finite float");
    }
    c->rms_norm_eps = eps;
  }
  if (const json* v = r.Find("mamba_ssm_dtype"); v != nullptr) {
    if (!v->is_string()) return r.Bad("mamba_ssm_dtype", "must be a string");
    c->mamba_ssm_dtype = v->get<std::string>();
  }
  if (const json* v = r.Find("tie_word_embeddings"); v != nullptr) {
    if (!v->is_boolean()) return r.Bad("tie_word_embeddings", "must be a bool");
    c->tie_word_embeddings = v->get<bool>();
  }
  if (const json* v = r.Find("mtp_num_hidden_layers"); v != nullptr) {
    int64_t n = -1;
    if (!JsonToInt64(*v, &n) || n < 0 || n > 64) {
      return r.Bad("mtp_num_hidden_layers", "must be an integer >= 0");
    }
    c->mtp_num_hidden_layers = static_cast<int>(n);
  }
  if (const json* v = r.Find("eos_token_id"); v != nullptr) {
    std::vector<json> ids =
        v->is_array() ? v->get<std::vector<json>>() : std::vector<json>{*v};
    for (const json& id : ids) {
      int64_t x = -1;
      if (!JsonToInt64(id, &x) || x < 0 || x > INT32_MAX) {
        return r.Bad("eos_token_id", "must be a token id or a list of them");
      }
      c->eos_token_ids.push_back(static_cast<int>(x));
    }
  }
  if (absl::Status s = ParseQuantization(r, c); !s.ok()) return s;
  if (absl::Status s = ParseLayerTypes(r, c); !s.ok()) return s;
  return ParseRope(r, c);
}

absl::Status Validate(const FieldReader& r, const ModelConfig& c) {
  // The derived widths (key_dim, value_dim, conv_dim, in_proj_dim) are ints.
  const int64_t key_dim =
      int64_t{c.linear_num_key_heads} * c.linear_key_head_dim;
  const int64_t value_dim =
      int64_t{c.linear_num_value_heads} * c.linear_value_head_dim;
  const int64_t in_proj =
      2 * key_dim + 2 * value_dim + 2 * int64_t{c.linear_num_value_heads};
  const int64_t q_dim = int64_t{c.num_attention_heads} * c.head_dim;
  if (key_dim > kMaxDim || value_dim > kMaxDim || in_proj > kMaxDim ||
      q_dim > kMaxDim) {
    return r.Bad("linear_num_key_heads",
                 absl::StrCat("and the other head sizes give projections over ",
                              kMaxDim, " wide"));
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return r.Bad("num_key_value_heads",
                 absl::StrCat("(", c.num_key_value_heads,
                              ") must divide num_attention_heads (",
                              c.num_attention_heads, ")"));
  }
  if (c.linear_num_value_heads % c.linear_num_key_heads != 0) {
    return r.Bad("linear_num_key_heads",
                 absl::StrCat("(", c.linear_num_key_heads,
                              ") must divide linear_num_value_heads (",
                              c.linear_num_value_heads, ")"));
  }
  const int rot = c.rotary_dim();
  if (rot <= 0 || rot % 2 != 0 || rot > c.head_dim) {
    return r.Bad(
        "partial_rotary_factor",
        absl::StrCat("gives rotary dim ", rot, " for head_dim ", c.head_dim,
                     "; it must be even, > 0 and <= ", "head_dim"));
  }
  return absl::OkStatus();
}

}  // namespace

int ModelConfig::rotary_dim() const {
  // As transformers: int(head_dim * partial_rotary_factor), truncating.
  return static_cast<int>(head_dim * partial_rotary_factor);
}

int ModelConfig::num_full_attention_layers() const {
  int n = 0;
  for (LayerType t : layer_types) n += t == LayerType::kFullAttention;
  return n;
}

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source) {
  json root;
  if (absl::Status s = ParseJson(json_text, source, &root); !s.ok()) return s;
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected a JSON object at top level"));
  }
  FieldReader reader(root, source);
  ModelConfig config;
  // nlohmann's typed getters throw on mismatches we did not foresee; keep
  // them inside this adapter.
  try {
    if (absl::Status s = ParseFields(reader, &config); !s.ok()) return s;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": unexpected value: ", e.what()));
  }
  if (absl::Status s = Validate(reader, config); !s.ok()) return s;
  return config;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  const std::string path = absl::StrCat(model_dir, "/config.json");
  std::string text;
  if (absl::Status s = ReadTextFile(path, &text); !s.ok()) return s;
  return ParseModelConfig(text, path);
}

}  // namespace specserve::model_files
