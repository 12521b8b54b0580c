// A model directory opened for reading: config.json plus safetensors weights
// (one model.safetensors, or shards listed in model.safetensors.index.json),
// memory-mapped. Open() checks every tensor the config implies (name, dtype,
// shape) so that the forward can look tensors up without further checks.
//
// Tensor names are canonical: the text-model prefix ("model." as transformers'
// Qwen3_5ForCausalLM saves, or "model.language_model." as real Qwen3.5
// checkpoints do) is stripped, e.g. "embed_tokens.weight",
// "layers.3.linear_attn.in_proj_qkv.weight", "norm.weight", "lm_head.weight"
// (absent when tied), "mtp.fc.weight", "mtp.layers.0.self_attn.q_proj.weight".
#ifndef SPECSERVE_WORKER_MODEL_FILES_CHECKPOINT_H_
#define SPECSERVE_WORKER_MODEL_FILES_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/types.h"
#include "worker/model_files/model_config.h"

namespace specserve::model_files {

// Storage types of weights: the compute backends' (kernels/types.h), so a
// tensor's dtype goes to Backend::UploadWeight unchanged.
using kernels::DType;
using kernels::DTypeName;  // "f32", "f16", "bf16"
using kernels::DTypeSize;

// A tensor inside a mapped file. `data` stays valid while the Checkpoint lives.
struct Tensor {
  std::string name;  // canonical name
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
  // Stored as float8_e4m3fn; Open() leaves none (it dequantizes them).
  bool f8_e4m3 = false;
  int64_t numel() const;
};

// The value of a float8_e4m3fn byte (NaN for 0x7f and 0xff; no infinities).
float Fp8E4M3ToFloat(uint8_t byte);

// One expected tensor: what the config implies.
struct TensorSpec {
  std::string name;  // canonical
  std::vector<int64_t> shape;
};

// Every tensor the forward needs for `config` (trunk; MTP when
// mtp_num_hidden_layers > 0; lm_head unless tied).
std::vector<TensorSpec> ExpectedTensors(const ModelConfig& config);

class Checkpoint {
 public:
  // Opens and validates `model_dir`. Errors name the file and the tensor or
  // field: truncated file, bad header JSON, unsupported dtype, offsets outside
  // the file, missing tensor, wrong shape, missing shard.
  //
  // An FP8 checkpoint (config.json's quantization_config, Fp8Quantization)
  // is dequantized here: each F8_E4M3 matrix W becomes W[i][j] =
  // fp8(W[i][j]) x S[i / block_rows][j / block_cols], S its
  // `weight_scale_inv` (f32, bf16 or f16), the product computed in f32 and
  // stored in the embedding's type when that is bf16 (rounded to nearest
  // even), else f32 (DESIGN's FP8 section). Refused, naming the
  // tensor: an FP8 matrix without its scale, a scale whose shape does not
  // tile the matrix by weight_block_size (a wrong block size), a scale that
  // is not finite and positive (corrupted), an FP8 NaN, a scale without an
  // FP8 matrix, FP8 tensors without quantization_config.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(
      const std::string& model_dir);

  ~Checkpoint();
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  // config().tie_word_embeddings is the effective choice: true when the
  // config ties lm_head to the embedding or the files hold no lm_head.weight
  // (then Find("lm_head.weight") is nullptr and the forward uses
  // "embed_tokens.weight").
  const ModelConfig& config() const { return config_; }
  const std::string& dir() const { return dir_; }

  // nullptr when absent. Lookup by canonical name.
  const Tensor* Find(const std::string& name) const;
  // CHECK-fails when absent: only for names in ExpectedTensors().
  const Tensor& Get(const std::string& name) const;
  // Whether the MTP head's tensors are present (and valid). False with a
  // logged warning when the config has an MTP head but the files hold no
  // mtp.* tensor; Open() fails when only some of them are present.
  bool has_mtp() const { return has_mtp_; }

  // Matrices that were stored in FP8 (dequantized to f32 here).
  int fp8_tensors() const { return fp8_tensors_; }

  // The dtype most weights use ("bf16", "f16", "f32"; weighted by element
  // count), parameter count and bytes of the tensors the forward uses (the
  // embedding once when tied; MTP only when has_mtp()).
  DType dtype() const { return dtype_; }
  uint64_t parameter_count() const { return parameter_count_; }
  uint64_t weight_bytes() const { return weight_bytes_; }

 private:
  Checkpoint() = default;
  struct MappedFile;
  std::string dir_;
  ModelConfig config_;
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, Tensor> tensors_;
  bool has_mtp_ = false;
  int fp8_tensors_ = 0;
  // The dequantized FP8 matrices (Tensor::data points into them; a deque
  // never moves its elements as it grows).
  std::deque<std::string> dequantized_;
  absl::Status DequantizeFp8(
      const std::map<std::string, const std::string*>& origin);
  DType dtype_ = DType::kF32;
  uint64_t parameter_count_ = 0;
  uint64_t weight_bytes_ = 0;
};

// Converts n elements of `dtype` at `src` to fp32 (bf16/f16 widening is exact).
void ToFloat(DType dtype, const void* src, size_t n, float* dst);

}  // namespace specserve::model_files

#endif  // SPECSERVE_WORKER_MODEL_FILES_CHECKPOINT_H_
