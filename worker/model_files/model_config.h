// The text-model configuration of a qwen3_5-family checkpoint, read from
// config.json (fields at top level or under "text_config"). See docs/MODEL.md.
// Every consumer (loader, forward, server info) reads this struct, never JSON.
#ifndef SPECSERVE_WORKER_MODEL_FILES_MODEL_CONFIG_H_
#define SPECSERVE_WORKER_MODEL_FILES_MODEL_CONFIG_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace specserve::model_files {

enum class LayerType { kLinearAttention, kFullAttention };

// config.json's "quantization_config" for Qwen's FP8 checkpoints
// (quant_method "fp8"): matrices stored as float8_e4m3fn with a float32
// `weight_scale_inv` per block of weight_block_size (rows, columns); the
// weight is fp8 x its block's scale. Activations are quantized dynamically
// (activation_scheme "dynamic") where a backend computes in FP8; the
// modules listed in modules_to_not_convert stay in their stored type.
struct Fp8Quantization {
  int block_rows = 128;
  int block_cols = 128;
  std::vector<std::string> modules_to_not_convert;
};

struct ModelConfig {
  std::string architecture;  // "architectures"[0], e.g. "Qwen3_5ForCausalLM"
  std::string model_type;    // e.g. "qwen3_5" or "qwen3_5_text"
  int vocab_size = 0;
  int hidden_size = 0;        // H
  int intermediate_size = 0;  // MLP inner size
  int num_hidden_layers = 0;
  // One entry per layer; from "layer_types", else from
  // "full_attention_interval" (layer i is full iff (i+1) % interval == 0).
  std::vector<LayerType> layer_types;
  int num_attention_heads = 0;     // nh
  int num_key_value_heads = 0;     // nkv; nh % nkv == 0
  int head_dim = 0;                // hd
  int linear_num_key_heads = 0;    // nk
  int linear_num_value_heads = 0;  // nv; nv % nk == 0
  int linear_key_head_dim = 0;     // dk
  int linear_value_head_dim = 0;   // dv
  int linear_conv_kernel_dim = 0;  // Kc
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;
  double rope_theta = 10000.0;
  double partial_rotary_factor = 0.25;
  int max_position_embeddings = 0;
  int mtp_num_hidden_layers = 0;   // 0 = no MTP head
  std::vector<int> eos_token_ids;  // "eos_token_id" (int or list), may be empty
  // "mamba_ssm_dtype" as written ("float32" in the Qwen3.5 checkpoints):
  // the precision the model's recurrent state was kept in; empty when the
  // config has none. The worker's --recurrent_state_dtype=auto reads it.
  std::string mamba_ssm_dtype;
  // Set for an FP8 checkpoint (quantization_config, quant_method "fp8").
  // Any other quant_method, or a malformed block, is an error naming the
  // field.
  std::optional<Fp8Quantization> fp8;

  // Derived sizes (docs/MODEL.md notation).
  int key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  int value_dim() const {
    return linear_num_value_heads * linear_value_head_dim;
  }
  int conv_dim() const { return 2 * key_dim() + value_dim(); }
  // Rows of the fused linear-attention input projection: qkv, z, b, a.
  int in_proj_dim() const {
    return conv_dim() + value_dim() + 2 * linear_num_value_heads;
  }
  // Rotated dims per head: head_dim * partial_rotary_factor (even).
  int rotary_dim() const;
  int num_full_attention_layers() const;
};

// Parses config.json text. `source` names the file in error messages.
// Errors (INVALID_ARGUMENT) name the file and the missing or bad field.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source);

// Reads and parses `model_dir`/config.json.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);

}  // namespace specserve::model_files

#endif  // SPECSERVE_WORKER_MODEL_FILES_MODEL_CONFIG_H_
