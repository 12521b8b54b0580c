// Test-only helpers: write safetensors files (well-formed or hand-broken) and
// complete tiny valid model directories (config.json + weights matching
// ExpectedTensors) under $TEST_TMPDIR.
#ifndef SPECSERVE_WORKER_MODEL_FILES_TEST_UTIL_H_
#define SPECSERVE_WORKER_MODEL_FILES_TEST_UTIL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/model_files/model_config.h"

namespace specserve::model_files::testing {

struct TestTensor {
  std::string dtype = "F32";  // safetensors spelling; any string is written
  std::vector<int64_t> shape;
  std::string bytes;  // raw data, written as is
};
// Stored (not canonical) name -> tensor.
using TensorMap = std::map<std::string, TestTensor>;

// A whole safetensors file; the header is space-padded to a multiple of 8.
std::string SafetensorsBytes(const TensorMap& tensors);
// A file from a hand-written header (for broken headers) and data region.
std::string SafetensorsFromHeader(const std::string& header_json,
                                  const std::string& data);

absl::Status WriteFile(const std::string& path, const std::string& bytes);
std::string ReadFileOrDie(const std::string& path);
// A fresh empty directory $TEST_TMPDIR/<name>.
std::string FreshDir(const std::string& name);

struct TinyModelOptions {
  std::string prefix = "model.";  // or "model.language_model." or ""
  bool tied = false;              // config's tie_word_embeddings
  bool write_lm_head = true;      // write lm_head.weight (when untied)
  int mtp_layers = 0;             // config's mtp_num_hidden_layers
  bool write_mtp = true;          // write the mtp.* tensors (when mtp_layers)
  std::string mtp_prefix = "";    // "" ("mtp.*") or "model." ("model.mtp.*")
  int num_shards = 1;             // > 1: shards plus an index file
  std::string dtype = "BF16";
  bool nest_text_config = false;  // fields under "text_config"
  bool use_interval = false;      // full_attention_interval, no layer_types
  bool add_visual = false;        // add a "model.visual.*" tensor
};

// 4 layers (3 linear + 1 full), H=16, V=32, tiny heads.
std::string TinyConfigJson(const TinyModelOptions& options);
// Weights for `config` with deterministic random data, stored names.
TensorMap TinyModelTensors(const ModelConfig& config,
                           const TinyModelOptions& options);
// Writes config.json and weights into `dir`; `edit` may change the tensors
// before they are written.
absl::Status WriteTinyModel(
    const std::string& dir, const TinyModelOptions& options,
    const std::function<void(TensorMap*)>& edit = nullptr);

}  // namespace specserve::model_files::testing

#endif  // SPECSERVE_WORKER_MODEL_FILES_TEST_UTIL_H_
