#include "tools/cuda_bench/random_model.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/ops.h"
#include "nlohmann/json.hpp"
#include "telemetry/status_macros.h"
#include "worker/model_files/checkpoint.h"
#include "worker/model_files/model_config.h"

namespace specserve::cuda_bench {

std::string Qwen35_27BConfigJson() {
  nlohmann::json c;
  c["architectures"] = {"Qwen3_5ForCausalLM"};
  c["model_type"] = "qwen3_5_text";
  c["vocab_size"] = 248320;
  c["hidden_size"] = 5120;
  c["intermediate_size"] = 17408;
  c["num_hidden_layers"] = 64;
  c["full_attention_interval"] = 4;
  std::vector<std::string> types;
  for (int i = 0; i < 64; ++i) {
    types.push_back((i + 1) % 4 == 0 ? "full_attention" : "linear_attention");
  }
  c["layer_types"] = types;
  c["num_attention_heads"] = 24;
  c["num_key_value_heads"] = 4;
  c["head_dim"] = 256;
  c["linear_num_key_heads"] = 16;
  c["linear_num_value_heads"] = 48;
  c["linear_key_head_dim"] = 128;
  c["linear_value_head_dim"] = 128;
  c["linear_conv_kernel_dim"] = 4;
  c["rms_norm_eps"] = 1e-6;
  c["tie_word_embeddings"] = false;
  c["rope_parameters"] = {{"rope_theta", 10000000.0},
                          {"partial_rotary_factor", 0.25},
                          {"rope_type", "default"}};
  c["partial_rotary_factor"] = 0.25;
  c["max_position_embeddings"] = 262144;
  c["mtp_num_hidden_layers"] = 1;
  c["eos_token_id"] = 248044;
  c["dtype"] = "bfloat16";
  return c.dump(2);
}

absl::Status WriteSyntheticCheckpoint(const std::string& config_json, const std::string& dir) {
  ::mkdir(dir.c_str(), 0755);
  {
    std::ofstream f(dir + "/config.json");
    f << config_json;
    if (!f) return absl::InternalError("cannot write " + dir + "/config.json");
  }
  SS_ASSIGN_OR_RETURN(model_files::ModelConfig config, model_files::LoadModelConfig(dir));
  nlohmann::json header = nlohmann::json::object();
  int64_t largest = 0;
  for (const model_files::TensorSpec& t : model_files::ExpectedTensors(config)) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    const int64_t bytes = n * 2;
    largest = std::max(largest, bytes);
    header[t.name] = {{"dtype", "BF16"}, {"shape", t.shape},
                                 {"data_offsets", {0, bytes}}};
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  const std::string path = dir + "/model.safetensors";
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0) return absl::InternalError("cannot create " + path);
  const uint64_t hlen = h.size();
  std::vector<char> head(8 + h.size());
  std::memcpy(head.data(), &hlen, 8);
  std::memcpy(head.data() + 8, h.data(), h.size());
  // Small random bf16 for the vectors (read from the region's start).
  std::vector<uint16_t> vec(std::min<int64_t>(largest / 2, 1 << 19));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-0.05f, 0.05f);
  for (auto& v : vec) {
    const float f = dist(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    v = static_cast<uint16_t>(bits >> 16);
  }
  bool ok = ::write(fd, head.data(), head.size()) == static_cast<ssize_t>(head.size()) &&
            ::write(fd, vec.data(), vec.size() * 2) == static_cast<ssize_t>(vec.size() * 2) &&
            ::ftruncate(fd, static_cast<off_t>(head.size() + largest)) == 0;
  ok = (::close(fd) == 0) && ok;
  if (!ok) return absl::InternalError("cannot write " + path);
  return absl::OkStatus();
}

absl::StatusOr<kernels::Weight> RandomWeightsBackend::UploadWeight(kernels::DType dtype,
                                                                   const void* /*host*/,
                                                                   int64_t rows, int64_t cols) {
  if (rows < 1 || cols < 1) return absl::InvalidArgumentError("random weight: empty");
  kernels::Weight w;
  w.dtype = dtype;
  w.rows = rows;
  w.cols = cols;
  SS_ASSIGN_OR_RETURN(w.storage, inner_->Allocate(w.bytes()));
  w.data = w.storage.data();
  SS_RETURN_IF_ERROR(kernels::cuda::LaunchFillRandom(dtype, w.storage.data(), rows * cols,
                                                     seed_++, scale_, inner_->stream()));
  SS_RETURN_IF_ERROR(inner_->TileForTensorCores(&w));  // (as CudaBackend::UploadWeight does)
  filled_bytes_ += w.bytes();
  return w;
}

absl::StatusOr<kernels::Weight> RandomWeightsBackend::UploadStackedWeight(
    kernels::DType dtype, const std::vector<WeightPart>& parts, int64_t cols) {
  int64_t rows = 0;
  for (const WeightPart& part : parts) rows += part.rows;
  return UploadWeight(dtype, nullptr, rows, cols);
}

void RandomWeightsBackend::StartTimeline() {
  if (events_.empty()) {
    events_.resize(4096);
    for (cudaEvent_t& e : events_) cudaEventCreate(&e);
    event_names_.resize(events_.size());
  }
  used_events_ = 0;
  timeline_ = true;
  Mark("start", absl::OkStatus()).IgnoreError();
}

absl::Status RandomWeightsBackend::Mark(const std::string& name, absl::Status s) {
  if (timeline_ && used_events_ < events_.size()) {
    cudaEventRecord(events_[used_events_], inner_->stream());
    event_names_[used_events_] = name;
    ++used_events_;
  }
  return s;
}

std::string RandomWeightsBackend::MatmulName(const kernels::MatmulParams& p) {
  return "matmul [" + std::to_string(p.out) + "][" + std::to_string(p.in) + "]";
}

std::map<std::string, std::pair<double, int>> RandomWeightsBackend::StopTimeline() {
  timeline_ = false;
  std::map<std::string, std::pair<double, int>> out;
  cudaStreamSynchronize(inner_->stream());
  for (size_t i = 1; i < used_events_; ++i) {
    float ms = 0;
    cudaEventElapsedTime(&ms, events_[i - 1], events_[i]);
    auto& slot = out[event_names_[i]];
    slot.first += ms;
    slot.second += 1;
  }
  return out;
}

}  // namespace specserve::cuda_bench
