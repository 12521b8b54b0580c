#include "worker/model_info.h"

namespace specserve::worker {

specserve::v1::ModelInfo DescribeModel(const model_files::Checkpoint& ckpt) {
  const model_files::ModelConfig& c = ckpt.config();
  specserve::v1::ModelInfo info;
  info.set_path(ckpt.dir());
  info.set_architecture(c.architecture);
  info.set_model_type(c.model_type);
  info.set_vocab_size(c.vocab_size);
  info.set_hidden_size(c.hidden_size);
  info.set_intermediate_size(c.intermediate_size);
  info.set_num_layers(c.num_hidden_layers);
  for (model_files::LayerType t : c.layer_types) {
    info.add_layer_types(t == model_files::LayerType::kFullAttention
                             ? specserve::v1::FULL_ATTENTION
                             : specserve::v1::LINEAR_ATTENTION);
  }
  info.set_num_attention_heads(c.num_attention_heads);
  info.set_num_key_value_heads(c.num_key_value_heads);
  info.set_head_dim(c.head_dim);
  info.set_linear_num_key_heads(c.linear_num_key_heads);
  info.set_linear_num_value_heads(c.linear_num_value_heads);
  info.set_linear_key_head_dim(c.linear_key_head_dim);
  info.set_linear_value_head_dim(c.linear_value_head_dim);
  info.set_linear_conv_kernel_dim(c.linear_conv_kernel_dim);
  info.set_max_context(c.max_position_embeddings);
  info.set_has_mtp(ckpt.has_mtp());
  info.set_mtp_num_layers(ckpt.has_mtp() ? c.mtp_num_hidden_layers : 0);
  info.set_tie_word_embeddings(c.tie_word_embeddings);
  info.set_dtype(model_files::DTypeName(ckpt.dtype()));
  info.set_parameter_count(ckpt.parameter_count());
  info.set_weight_bytes(ckpt.weight_bytes());
  for (int id : c.eos_token_ids) info.add_eos_token_ids(id);
  return info;
}

}  // namespace specserve::worker
