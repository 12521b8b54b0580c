#include "worker/model_files/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
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
