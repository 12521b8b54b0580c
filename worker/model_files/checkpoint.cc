#include "worker/model_files/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"
#include "telemetry/status_macros.h"
#include "worker/model_files/json_util.h"
#include "worker/model_files/safetensors.h"

namespace specserve::model_files {

struct Checkpoint::MappedFile {
  std::unique_ptr<SafetensorsFile> file;
};

namespace {

constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string ShapeStr(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Maps a stored name to its canonical name; "" for tensors of other towers
// (vision), which are ignored.
std::string CanonicalName(const std::string& raw) {
  std::string name = raw;
  if (absl::StartsWith(name, "model.language_model.")) {
    name = name.substr(std::strlen("model.language_model."));
  } else if (absl::StartsWith(name, "model.")) {
    name = name.substr(std::strlen("model."));  // also "model.mtp.*"
  }
  if (absl::StartsWith(name, "visual.") ||
      absl::StartsWith(name, "vision_tower.")) {
    return "";
  }
  return name;
}

// The decoder-layer tensors under `p` (e.g. "layers.3." or "mtp.layers.0.").
void AddLayer(const ModelConfig& c, const std::string& p, LayerType type,
              std::vector<TensorSpec>* out) {
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  out->push_back({p + "input_layernorm.weight", {h}});
  out->push_back({p + "post_attention_layernorm.weight", {h}});
  if (type == LayerType::kLinearAttention) {
    const std::string a = p + "linear_attn.";
    const int64_t nv = c.linear_num_value_heads, vd = c.value_dim(),
                  cd = c.conv_dim();
    out->push_back({a + "in_proj_qkv.weight", {cd, h}});
    out->push_back({a + "in_proj_z.weight", {vd, h}});
    out->push_back({a + "in_proj_b.weight", {nv, h}});
    out->push_back({a + "in_proj_a.weight", {nv, h}});
    out->push_back({a + "conv1d.weight", {cd, 1, c.linear_conv_kernel_dim}});
    out->push_back({a + "dt_bias", {nv}});
    out->push_back({a + "A_log", {nv}});
    out->push_back({a + "norm.weight", {c.linear_value_head_dim}});
    out->push_back({a + "out_proj.weight", {h, vd}});
  } else {
    const std::string a = p + "self_attn.";
    const int64_t hd = c.head_dim, nh = c.num_attention_heads,
                  nkv = c.num_key_value_heads;
    out->push_back({a + "q_proj.weight", {2 * nh * hd, h}});
    out->push_back({a + "k_proj.weight", {nkv * hd, h}});
    out->push_back({a + "v_proj.weight", {nkv * hd, h}});
    out->push_back({a + "o_proj.weight", {h, nh * hd}});
    out->push_back({a + "q_norm.weight", {hd}});
    out->push_back({a + "k_norm.weight", {hd}});
  }
  out->push_back({p + "mlp.gate_proj.weight", {inter, h}});
  out->push_back({p + "mlp.up_proj.weight", {inter, h}});
  out->push_back({p + "mlp.down_proj.weight", {h, inter}});
}

// Lists the weight files of `dir`. `source` is the file named in
// missing-tensor errors (the index when sharded).
absl::Status ListWeightFiles(const std::string& dir, std::string* source,
                             std::vector<std::string>* files,
                             std::map<std::string, std::string>* weight_map) {
  const std::string index_path = absl::StrCat(dir, "/", kIndexFile);
  const std::string single_path = absl::StrCat(dir, "/", kSingleFile);
  if (!FileExists(index_path)) {
    if (!FileExists(single_path)) {
      return absl::NotFoundError(
          absl::StrCat(dir, ": no ", kSingleFile, " or ", kIndexFile));
    }
    *source = single_path;
    files->push_back(kSingleFile);
    return absl::OkStatus();
  }
  *source = index_path;
  std::string text;
  SS_RETURN_IF_ERROR(ReadTextFile(index_path, &text));
  nlohmann::json index;
  SS_RETURN_IF_ERROR(ParseJson(text, index_path, &index));
  const nlohmann::json* wm = nullptr;
  if (index.is_object()) {
    auto it = index.find("weight_map");
    if (it != index.end() && it->is_object()) wm = &*it;
  }
  if (wm == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": field 'weight_map' missing"));
  }
  std::set<std::string> unique;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string() || it.value().get<std::string>().empty() ||
        absl::StrContains(it.value().get<std::string>(), "/")) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": bad shard for tensor '", it.key(), "'"));
    }
    (*weight_map)[it.key()] = it.value().get<std::string>();
    unique.insert(it.value().get<std::string>());
  }
  files->assign(unique.begin(), unique.end());
  for (const std::string& f : *files) {
    if (!FileExists(absl::StrCat(dir, "/", f))) {
      return absl::NotFoundError(absl::StrCat(index_path, ": shard file '", f,
                                              "' missing (", dir, "/", f, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<TensorSpec> ExpectedTensors(const ModelConfig& c) {
  CHECK_EQ(static_cast<int>(c.layer_types.size()), c.num_hidden_layers)
      << "ModelConfig.layer_types must have one entry per layer";
  std::vector<TensorSpec> out;
  const int64_t h = c.hidden_size, v = c.vocab_size;
  out.push_back({"embed_tokens.weight", {v, h}});
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    AddLayer(c, absl::StrCat("layers.", i, "."), c.layer_types[i], &out);
  }
  out.push_back({"norm.weight", {h}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {v, h}});
  if (c.mtp_num_hidden_layers > 0) {
    out.push_back({"mtp.fc.weight", {h, 2 * h}});
    out.push_back({"mtp.pre_fc_norm_embedding.weight", {h}});
    out.push_back({"mtp.pre_fc_norm_hidden.weight", {h}});
    out.push_back({"mtp.norm.weight", {h}});
    for (int j = 0; j < c.mtp_num_hidden_layers; ++j) {
      AddLayer(c, absl::StrCat("mtp.layers.", j, "."),
               LayerType::kFullAttention, &out);
    }
  }
  return out;
}

Checkpoint::~Checkpoint() = default;

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(
    const std::string& model_dir) {
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->dir_ = model_dir;
  SS_ASSIGN_OR_RETURN(ck->config_, LoadModelConfig(model_dir));

  std::string source;
  std::vector<std::string> shard_names;
  std::map<std::string, std::string> weight_map;  // raw name -> shard
  SS_RETURN_IF_ERROR(
      ListWeightFiles(model_dir, &source, &shard_names, &weight_map));

  std::map<std::string, const std::string*> origin;  // canonical -> path
  for (const std::string& shard : shard_names) {
    auto mapped = std::make_unique<MappedFile>();
    SS_ASSIGN_OR_RETURN(mapped->file, SafetensorsFile::Open(
                                          absl::StrCat(model_dir, "/", shard)));
    const SafetensorsFile& f = *mapped->file;
    std::set<std::string> raw_names;
    for (const SafetensorsEntry& e : f.entries) {
      raw_names.insert(e.name);
      const std::string name = CanonicalName(e.name);
      if (name.empty()) continue;
      if (ck->tensors_.count(name) != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(f.path, ": tensor '", e.name, "' duplicates '", name,
                         "' in ", *origin[name]));
      }
      Tensor t;
      t.name = name;
      t.dtype = e.dtype;
      t.f8_e4m3 = e.f8_e4m3;
      t.shape = e.shape;
      t.data = f.DataOf(e);
      t.nbytes = e.nbytes;
      ck->tensors_.emplace(name, std::move(t));
      origin[name] = &f.path;
    }
    for (const auto& [raw, file] : weight_map) {
      if (file == shard && raw_names.count(raw) == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": tensor '", raw, "' is mapped to ", shard,
                         " but ", f.path, " does not contain it"));
      }
    }
    ck->files_.push_back(std::move(mapped));
  }

  SS_RETURN_IF_ERROR(ck->DequantizeFp8(origin));

  // lm_head is the embedding when the config ties them or the file has no
  // lm_head; config_.tie_word_embeddings then records the effective choice.
  ModelConfig& config = ck->config_;
  if (config.tie_word_embeddings) {
    ck->tensors_.erase("lm_head.weight");
  } else if (ck->tensors_.count("lm_head.weight") == 0) {
    config.tie_word_embeddings = true;
  }

  std::vector<TensorSpec> expected = ExpectedTensors(config);
  size_t mtp_present = 0, mtp_expected = 0;
  for (const TensorSpec& s : expected) {
    if (!absl::StartsWith(s.name, "mtp.")) continue;
    ++mtp_expected;
    mtp_present += ck->tensors_.count(s.name);
  }
  if (mtp_expected > 0 && mtp_present == 0) {
    LOG(WARNING) << source << ": config has mtp_num_hidden_layers="
                 << config.mtp_num_hidden_layers
                 << " but the checkpoint has no mtp.* tensors; "
                    "speculative decoding with the MTP head is unavailable";
    expected.erase(std::remove_if(expected.begin(), expected.end(),
                                  [](const TensorSpec& s) {
                                    return absl::StartsWith(s.name, "mtp.");
                                  }),
                   expected.end());
  }
  ck->has_mtp_ = mtp_expected > 0 && mtp_present > 0;

  std::map<DType, uint64_t> elems_by_dtype;
  for (const TensorSpec& s : expected) {
    auto it = ck->tensors_.find(s.name);
    if (it == ck->tensors_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": missing tensor '", s.name, "'"));
    }
    const Tensor& t = it->second;
    if (t.shape != s.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(*origin[s.name], ": tensor '", s.name, "' has shape ",
                       ShapeStr(t.shape), ", expected ", ShapeStr(s.shape)));
    }
    elems_by_dtype[t.dtype] += static_cast<uint64_t>(t.numel());
    ck->parameter_count_ += static_cast<uint64_t>(t.numel());
    ck->weight_bytes_ += t.nbytes;
  }
  // Weighted by elements, so that small fp32 norms and gates kept beside
  // bf16 matrices do not decide the checkpoint's dtype.
  uint64_t best = 0;
  for (const auto& [dtype, n] : elems_by_dtype) {
    if (n > best) {
      best = n;
      ck->dtype_ = dtype;
    }
  }
  return ck;
}

float Fp8E4M3ToFloat(uint8_t byte) {
  const int sign = byte >> 7, exp = (byte >> 3) & 0xf, mant = byte & 0x7;
  if (exp == 0xf && mant == 0x7) return std::nanf("");
  const float magnitude =
      exp == 0 ? std::ldexp(static_cast<float>(mant), -9)  // 2^-6 * m/8
               : std::ldexp(1.0f + mant / 8.0f, exp - 7);
  return sign ? -magnitude : magnitude;
}

absl::Status Checkpoint::DequantizeFp8(
    const std::map<std::string, const std::string*>& origin) {
  constexpr absl::string_view kScale = "_scale_inv";
  auto where = [&](const std::string& name) {
    auto it = origin.find(name);
    return it == origin.end() ? dir_ : *it->second;
  };
  std::vector<std::string> fp8, scales;
  for (const auto& [name, t] : tensors_) {
    if (t.f8_e4m3) fp8.push_back(name);
    if (absl::EndsWith(name, kScale)) scales.push_back(name);
  }
  if (!fp8.empty() && !config_.fp8) {
    return absl::InvalidArgumentError(absl::StrCat(
        where(fp8[0]), ": tensor '", fp8[0],
        "' is F8_E4M3 but config.json has no quantization_config with "
        "quant_method \"fp8\""));
  }
  for (const std::string& s : scales) {
    const std::string weight = s.substr(0, s.size() - kScale.size());
    auto w = tensors_.find(weight);
    if (w == tensors_.end() || !w->second.f8_e4m3) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(s), ": scale '", s,
                       "' belongs to no F8_E4M3 tensor '", weight, "'"));
    }
  }
  // bf16 when the embedding is (Qwen's FP8 checkpoints), else f32.
  const Tensor* embed = Find("embed_tokens.weight");
  const DType weight_dtype =
      embed != nullptr && embed->dtype == DType::kBF16 && !embed->f8_e4m3
          ? DType::kBF16
          : DType::kF32;
  for (const std::string& name : fp8) {
    Tensor& t = tensors_[name];
    const std::string scale_name = name + std::string(kScale);
    auto sc = tensors_.find(scale_name);
    if (sc == tensors_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(name), ": FP8 tensor '", name,
                       "' has no block scale '", scale_name, "'"));
    }
    if (t.shape.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(name), ": FP8 tensor '", name, "' has shape ",
                       ShapeStr(t.shape), "; only matrices are quantized"));
    }
    const int64_t rows = t.shape[0], cols = t.shape[1];
    const int br = config_.fp8->block_rows, bc = config_.fp8->block_cols;
    const std::vector<int64_t> want = {(rows + br - 1) / br,
                                       (cols + bc - 1) / bc};
    const Tensor& s = sc->second;
    if (s.f8_e4m3 || s.shape != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          where(scale_name), ": scale '", scale_name, "' has shape ",
          ShapeStr(s.shape), s.f8_e4m3 ? " in F8_E4M3" : "",
          "; weight_block_size [", br, ", ", bc, "] over '", name, "' ",
          ShapeStr(t.shape), " needs ", ShapeStr(want),
          " (a wrong block size in config.json, or scales of another "
          "layout)"));
    }
    std::vector<float> scale(static_cast<size_t>(want[0] * want[1]));
    ToFloat(s.dtype, s.data, scale.size(), scale.data());
    for (size_t b = 0; b < scale.size(); ++b) {
      if (!(std::isfinite(scale[b]) && scale[b] > 0.0f)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where(scale_name), ": scale '", scale_name, "' block (",
            b / want[1], ", ", b % want[1], ") is ", scale[b],
            "; a block scale must be finite and > 0 (corrupted file?)"));
      }
    }
    std::vector<float> out(static_cast<size_t>(rows * cols));
    const uint8_t* q = static_cast<const uint8_t*>(t.data);
    for (int64_t i = 0; i < rows; ++i) {
      const float* srow = scale.data() + (i / br) * want[1];
      for (int64_t j = 0; j < cols; ++j) {
        const float v = Fp8E4M3ToFloat(q[i * cols + j]);
        if (std::isnan(v)) {
          return absl::InvalidArgumentError(
              absl::StrCat(where(name), ": FP8 tensor '", name,
                           "' holds NaN at [", i, ", ", j, "]"));
        }
        out[i * cols + j] = v * srow[j / bc];
      }
    }
    // Stored in the type of the matrices left unquantized (the embedding's):
    // the forward needs one type across a layer's fused projections, and
    // it keeps the dequantized model at the bytes of a bf16 one.
    t.f8_e4m3 = false;
    t.dtype = weight_dtype;
    std::string& bytes = dequantized_.emplace_back();
    if (weight_dtype == DType::kBF16) {
      bytes.resize(out.size() * 2);
      for (size_t e = 0; e < out.size(); ++e) {
        const uint16_t h = kernels::FloatToBf16(out[e]);
        std::memcpy(&bytes[2 * e], &h, 2);
      }
    } else {
      bytes.assign(reinterpret_cast<const char*>(out.data()),
                   out.size() * sizeof(float));
    }
    t.data = bytes.data();
    t.nbytes = bytes.size();
    tensors_.erase(sc);
    ++fp8_tensors_;
  }
  return absl::OkStatus();
}

const Tensor* Checkpoint::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const Tensor& Checkpoint::Get(const std::string& name) const {
  const Tensor* t = Find(name);
  CHECK(t != nullptr) << dir_ << ": tensor '" << name
                      << "' is not in the checkpoint (Get() is only for "
                         "names from ExpectedTensors())";
  return *t;
}

void ToFloat(DType dtype, const void* src, size_t n, float* dst) {
  const uint8_t* p = static_cast<const uint8_t*>(src);
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        const uint32_t bits = static_cast<uint32_t>(h) << 16;
        std::memcpy(&dst[i], &bits, 4);
      }
      return;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
        uint32_t exp = (h >> 10) & 0x1f;
        uint32_t mant = h & 0x3ff;
        uint32_t bits;
        if (exp == 0x1f) {  // inf / nan (payload kept)
          bits = sign | 0x7f800000u | (mant << 13);
        } else if (exp != 0) {  // normal
          bits = sign | ((exp + 112) << 23) | (mant << 13);
        } else if (mant == 0) {  // signed zero
          bits = sign;
        } else {        // subnormal: normalize into an f32 normal
          int e = 113;  // exponent of 2^-14 in f32 bias, before shifting
          while ((mant & 0x400) == 0) {
            mant <<= 1;
            --e;
          }
          bits =
              sign | (static_cast<uint32_t>(e) << 23) | ((mant & 0x3ff) << 13);
        }
        std::memcpy(&dst[i], &bits, 4);
      }
      return;
  }
}

}  // namespace specserve::model_files
