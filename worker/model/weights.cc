// Model::LoadWeights: checkpoint tensors -> backend weights (model.h).
// Matrices stay in their storage dtype (the CPU backend reads the mapped
// file in place, so loading is fast); vectors are widened to fp32 once.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/rope.h"
#include "telemetry/status_macros.h"
#include "worker/model/model.h"

namespace specserve::model {
namespace {

using model_files::Checkpoint;
using model_files::Tensor;

class Loader {
 public:
  Loader(const Checkpoint& ck, kernels::Backend* backend)
      : ck_(ck), backend_(backend) {}

  // A 2-D matrix [rows][cols] (checked against the tensor's element count).
  absl::Status Matrix(const std::string& name, int64_t rows, int64_t cols,
                      Weight* out) {
    const Tensor& t = ck_.Get(name);
    if (t.numel() != rows * cols) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": ", t.numel(), " elements, expected ", rows, "x", cols));
    }
    SS_ASSIGN_OR_RETURN(*out,
                        backend_->UploadWeight(t.dtype, t.data, rows, cols));
    return absl::OkStatus();
  }

  // Matrices [rows_i][cols] of one dtype stacked into one weight, in order.
  absl::Status Stacked(
      const std::vector<std::pair<std::string, int64_t>>& parts, int64_t cols,
      Weight* out) {
    std::vector<kernels::Backend::WeightPart> host;
    kernels::DType dtype = ck_.Get(parts.front().first).dtype;
    for (const auto& [name, rows] : parts) {
      const Tensor& t = ck_.Get(name);
      if (t.numel() != rows * cols) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, ": ", t.numel(), " elements, expected ", rows, "x", cols));
      }
      if (t.dtype != dtype) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": dtype differs from ", parts.front().first));
      }
      host.push_back({t.data, rows});
    }
    SS_ASSIGN_OR_RETURN(*out, backend_->UploadStackedWeight(dtype, host, cols));
    return absl::OkStatus();
  }

  // Any tensor of n elements, widened to fp32 in backend memory.
  absl::Status Vector(const std::string& name, int64_t n, Buffer* out) {
    const Tensor& t = ck_.Get(name);
    if (t.numel() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": ", t.numel(), " elements, expected ", n));
    }
    std::vector<float> host(n);
    model_files::ToFloat(t.dtype, t.data, n, host.data());
    return Floats(host, out);
  }

  absl::Status Floats(const std::vector<float>& host, Buffer* out) {
    SS_ASSIGN_OR_RETURN(*out, backend_->AllocateFloats(host.size()));
    return backend_->CopyToDevice(out->data(), host.data(),
                                  host.size() * sizeof(float));
  }

 private:
  const Checkpoint& ck_;
  kernels::Backend* backend_;
};

absl::Status LoadLayer(const ModelConfig& c, const std::string& prefix,
                       LayerType type, Loader* ld, LayerWeights* w) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  w->type = type;
  SS_RETURN_IF_ERROR(
      ld->Vector(prefix + "input_layernorm.weight", H, &w->input_norm));
  SS_RETURN_IF_ERROR(ld->Vector(prefix + "post_attention_layernorm.weight", H,
                                &w->post_attention_norm));
  if (type == LayerType::kFullAttention) {
    const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads,
                  hd = c.head_dim;
    const std::string p = prefix + "self_attn.";
    AttentionWeights& a = w->attn;
    SS_RETURN_IF_ERROR(ld->Stacked({{p + "q_proj.weight", 2 * nh * hd},
                                    {p + "k_proj.weight", nkv * hd},
                                    {p + "v_proj.weight", nkv * hd}},
                                   H, &a.qkv_proj));
    SS_RETURN_IF_ERROR(ld->Matrix(p + "o_proj.weight", H, nh * hd, &a.o_proj));
    SS_RETURN_IF_ERROR(ld->Vector(p + "q_norm.weight", hd, &a.q_norm));
    SS_RETURN_IF_ERROR(ld->Vector(p + "k_norm.weight", hd, &a.k_norm));
  } else {
    const int64_t nv = c.linear_num_value_heads, dv = c.linear_value_head_dim;
    const std::string p = prefix + "linear_attn.";
    LinearAttentionWeights& l = w->linear;
    SS_RETURN_IF_ERROR(ld->Stacked({{p + "in_proj_qkv.weight", c.conv_dim()},
                                    {p + "in_proj_z.weight", c.value_dim()},
                                    {p + "in_proj_b.weight", nv},
                                    {p + "in_proj_a.weight", nv}},
                                   H, &l.in_proj));
    SS_RETURN_IF_ERROR(
        ld->Matrix(p + "out_proj.weight", H, c.value_dim(), &l.out_proj));
    SS_RETURN_IF_ERROR(
        ld->Vector(p + "conv1d.weight",
                   int64_t{c.conv_dim()} * c.linear_conv_kernel_dim, &l.conv));
    SS_RETURN_IF_ERROR(ld->Vector(p + "dt_bias", nv, &l.dt_bias));
    SS_RETURN_IF_ERROR(ld->Vector(p + "A_log", nv, &l.a_log));
    SS_RETURN_IF_ERROR(ld->Vector(p + "norm.weight", dv, &l.norm));
  }
  const std::string p = prefix + "mlp.";
  SS_RETURN_IF_ERROR(
      ld->Stacked({{p + "gate_proj.weight", I}, {p + "up_proj.weight", I}}, H,
                  &w->mlp.gate_up));
  SS_RETURN_IF_ERROR(
      ld->Matrix(p + "down_proj.weight", H, I, &w->mlp.down_proj));
  return absl::OkStatus();
}

}  // namespace

absl::Status Model::LoadWeights() {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  Loader ld(*checkpoint_, backend_);
  ModelWeights& w = weights_;
  SS_RETURN_IF_ERROR(ld.Matrix("embed_tokens.weight", V, H, &w.embed));
  if (checkpoint_->Find("lm_head.weight") != nullptr &&
      !c.tie_word_embeddings) {
    SS_RETURN_IF_ERROR(ld.Matrix("lm_head.weight", V, H, &w.lm_head));
  } else {
    w.lm_head.dtype = w.embed.dtype;
    w.lm_head.layout = w.embed.layout;
    w.lm_head.rows = w.embed.rows;
    w.lm_head.cols = w.embed.cols;
    w.lm_head.data = w.embed.data;  // tied: no second copy
  }
  SS_RETURN_IF_ERROR(ld.Vector("norm.weight", H, &w.final_norm));
  w.layers.resize(c.num_hidden_layers);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    SS_RETURN_IF_ERROR(LoadLayer(c, absl::StrCat("layers.", i, "."),
                                 c.layer_types[i], &ld, &w.layers[i]));
  }
  w.has_mtp = checkpoint_->has_mtp();
  if (w.has_mtp) {
    if (c.mtp_num_hidden_layers != 1) {
      return absl::UnimplementedError(
          absl::StrCat("mtp_num_hidden_layers = ", c.mtp_num_hidden_layers,
                       "; only 1 is supported"));
    }
    SS_RETURN_IF_ERROR(ld.Matrix("mtp.fc.weight", H, 2 * H, &w.mtp.fc));
    SS_RETURN_IF_ERROR(ld.Vector("mtp.pre_fc_norm_embedding.weight", H,
                                 &w.mtp.pre_fc_norm_embedding));
    SS_RETURN_IF_ERROR(ld.Vector("mtp.pre_fc_norm_hidden.weight", H,
                                 &w.mtp.pre_fc_norm_hidden));
    SS_RETURN_IF_ERROR(ld.Vector("mtp.norm.weight", H, &w.mtp.norm));
    SS_RETURN_IF_ERROR(LoadLayer(c, "mtp.layers.0.", LayerType::kFullAttention,
                                 &ld, &w.mtp.layer));
  }
  return ld.Floats(kernels::RopeInvFreq(c.rope_theta, c.rotary_dim()),
                   &w.rope_inv_freq);
}

uint64_t Model::decode_weight_bytes() const {
  uint64_t n = weights_.lm_head.bytes();
  for (const LayerWeights& l : weights_.layers) {
    if (l.type == LayerType::kFullAttention) {
      n += l.attn.qkv_proj.bytes() + l.attn.o_proj.bytes();
    } else {
      n += l.linear.in_proj.bytes() + l.linear.out_proj.bytes();
    }
    n += l.mlp.gate_up.bytes() + l.mlp.down_proj.bytes();
  }
  return n;
}

}  // namespace specserve::model
