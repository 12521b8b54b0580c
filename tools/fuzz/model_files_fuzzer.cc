// libFuzzer target: the model-file parsers of worker/model_files, on
// arbitrary bytes. Each input goes to
//  1. ParseSafetensors (in memory: the parser SafetensorsFile::Open runs on
//     its mapping); accepted entries must satisfy the header's invariants
//     (dtype known, [offset, offset + nbytes) inside the data region,
//     nbytes == numel * DTypeSize), and every tensor is read with ToFloat;
//  2. ParseModelConfig (in memory: what LoadModelConfig runs on the file's
//     text); an accepted config must satisfy the invariants model_config.h
//     states, and then goes through what its consumers compute from it:
//     the derived sizes (key_dim .. in_proj_dim, rotary_dim) and
//     ExpectedTensors, as Checkpoint::Open does next;
//  3. when (1) accepted it: Checkpoint::Open on a model directory holding
//     these bytes as model.safetensors beside a fixed micro config.json
//     (Checkpoint::Open takes a directory; the directory is written once,
//     the weights file per input, under $TMPDIR, else /dev/shm). An opened
//     checkpoint must hold every expected tensor with its expected shape.
// Every refusal must be INVALID_ARGUMENT with a message naming the source.
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "worker/model_files/checkpoint.h"
#include "worker/model_files/model_config.h"
#include "worker/model_files/safetensors.h"

namespace {

namespace mf = specserve::model_files;

#define FUZZ_CHECK(cond, ...)                                 \
  do {                                                        \
    if (!(cond)) {                                            \
      std::fprintf(stderr, "FUZZ_CHECK failed: %s: ", #cond); \
      std::fprintf(stderr, __VA_ARGS__);                      \
      std::fprintf(stderr, "\n");                             \
      std::abort();                                           \
    }                                                         \
  } while (0)

// The checkpoint directory's config.json: every size 1 or 2 (two layers, an
// MTP head, untied lm_head), so a complete matching safetensors file is a
// few KB (tools/fuzz/corpus/model_files/micro_model.safetensors).
constexpr char kMicroConfig[] = R"({
  "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
  "vocab_size": 4, "hidden_size": 2, "intermediate_size": 2,
  "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"],
  "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 4,
  "linear_num_key_heads": 1, "linear_num_value_heads": 1,
  "linear_key_head_dim": 1, "linear_value_head_dim": 1,
  "linear_conv_kernel_dim": 2, "partial_rotary_factor": 0.5,
  "max_position_embeddings": 64, "mtp_num_hidden_layers": 1,
  "tie_word_embeddings": false, "eos_token_id": 3
})";

// Largest layer count whose ExpectedTensors the harness builds (a bigger
// config is valid, but listing its tensors is just slow).
constexpr int kMaxLayersListed = 4096;

std::string g_dir;  // the checkpoint directory
bool g_verbose =
    false;  // SPECSERVE_FUZZ_VERBOSE=1: print what each parser said

void CheckRefusal(const absl::Status& s, const std::string& source) {
  FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument, "%s",
             s.ToString().c_str());
  FUZZ_CHECK(absl::StrContains(s.message(), source),
             "the message does not name %s: %s", source.c_str(),
             s.ToString().c_str());
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void CheckSafetensors(const uint8_t* data, size_t size, bool* accepted) {
  auto entries = mf::ParseSafetensors(data, size, "fuzz.safetensors");
  *accepted = entries.ok();
  if (g_verbose) {
    std::fprintf(stderr, "ParseSafetensors: %s\n",
                 entries.ok()
                     ? absl::StrCat(entries->size(), " tensors").c_str()
                     : entries.status().ToString().c_str());
  }
  if (!entries.ok()) {
    CheckRefusal(entries.status(), "fuzz.safetensors");
    return;
  }
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = (header << 8) | data[i];
  std::vector<float> values;
  for (const mf::SafetensorsEntry& e : *entries) {
    FUZZ_CHECK(e.dtype == mf::DType::kF32 || e.dtype == mf::DType::kF16 ||
                   e.dtype == mf::DType::kBF16,
               "dtype");
    for (int64_t d : e.shape) FUZZ_CHECK(d >= 0, "negative dim");
    FUZZ_CHECK(e.offset >= 8 + header && e.offset <= size &&
                   e.nbytes <= size - e.offset,
               "tensor '%s' [%zu, +%zu) outside the %zu-byte file",
               e.name.c_str(), e.offset, e.nbytes, size);
    FUZZ_CHECK(static_cast<uint64_t>(Numel(e.shape)) * mf::DTypeSize(e.dtype) ==
                   e.nbytes,
               "tensor '%s': nbytes %zu", e.name.c_str(), e.nbytes);
    const size_t n = e.nbytes / mf::DTypeSize(e.dtype);
    values.resize(n);
    mf::ToFloat(e.dtype, data + e.offset, n, values.data());
  }
}

void CheckConfig(const std::string& text) {
  auto config = mf::ParseModelConfig(text, "fuzz/config.json");
  if (g_verbose) {
    std::fprintf(stderr, "ParseModelConfig: %s\n",
                 config.status().ToString().c_str());
  }
  if (!config.ok()) {
    CheckRefusal(config.status(), "fuzz/config.json");
    return;
  }
  const mf::ModelConfig& c = *config;
  for (int v :
       {c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers,
        c.num_attention_heads, c.num_key_value_heads, c.head_dim,
        c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
        c.linear_value_head_dim, c.linear_conv_kernel_dim,
        c.max_position_embeddings}) {
    FUZZ_CHECK(v > 0, "a size is %d", v);
  }
  FUZZ_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, "nh % nkv");
  FUZZ_CHECK(c.linear_num_value_heads % c.linear_num_key_heads == 0, "nv % nk");
  FUZZ_CHECK(static_cast<int>(c.layer_types.size()) == c.num_hidden_layers,
             "layer_types");
  FUZZ_CHECK(c.rms_norm_eps > 0 && std::isfinite(c.rms_norm_eps),
             "rms_norm_eps = %g (the config said a positive number)",
             c.rms_norm_eps);
  FUZZ_CHECK(c.rope_theta > 0, "rope_theta = %g", c.rope_theta);
  FUZZ_CHECK(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1,
             "partial_rotary_factor = %g", c.partial_rotary_factor);
  FUZZ_CHECK(c.mtp_num_hidden_layers >= 0 && c.mtp_num_hidden_layers <= 64,
             "mtp layers");
  const int rot = c.rotary_dim();
  FUZZ_CHECK(rot > 0 && rot % 2 == 0 && rot <= c.head_dim, "rotary_dim %d",
             rot);
  for (int id : c.eos_token_ids) FUZZ_CHECK(id >= 0, "eos id");
  FUZZ_CHECK(c.num_full_attention_layers() >= 0 &&
                 c.num_full_attention_layers() <= c.num_hidden_layers,
             "full layers");
  // The sizes every consumer (loader, forward) derives: int arithmetic.
  volatile int derived[] = {c.key_dim(), c.value_dim(), c.conv_dim(),
                            c.in_proj_dim()};
  (void)derived;
  if (c.num_hidden_layers + c.mtp_num_hidden_layers <= kMaxLayersListed) {
    for (const mf::TensorSpec& s : mf::ExpectedTensors(c)) {
      for (int64_t d : s.shape) {
        FUZZ_CHECK(d > 0, "expected tensor %s has a dim %lld", s.name.c_str(),
                   static_cast<long long>(d));
      }
    }
  }
}

void CheckCheckpoint(const uint8_t* data, size_t size) {
  const std::string path = g_dir + "/model.safetensors";
  {
    std::ofstream out(path + ".tmp", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), size);
    FUZZ_CHECK(out.good(), "cannot write %s", path.c_str());
  }
  // A new inode each time: a mapping of the last one is never rewritten.
  FUZZ_CHECK(std::rename((path + ".tmp").c_str(), path.c_str()) == 0, "rename");
  auto ck = mf::Checkpoint::Open(g_dir);
  if (g_verbose) {
    std::fprintf(stderr, "Checkpoint::Open: %s\n",
                 ck.status().ToString().c_str());
  }
  if (!ck.ok()) {
    CheckRefusal(ck.status(), g_dir);
    return;
  }
  uint64_t params = 0;
  std::vector<float> values;
  for (const mf::TensorSpec& s : mf::ExpectedTensors((*ck)->config())) {
    if (!(*ck)->has_mtp() && absl::StartsWith(s.name, "mtp.")) continue;
    const mf::Tensor* t = (*ck)->Find(s.name);
    FUZZ_CHECK(t != nullptr, "opened checkpoint lacks %s", s.name.c_str());
    FUZZ_CHECK(t->shape == s.shape, "%s has the wrong shape", s.name.c_str());
    FUZZ_CHECK(
        t->nbytes == static_cast<size_t>(t->numel()) * mf::DTypeSize(t->dtype),
        "%s nbytes", s.name.c_str());
    values.resize(t->numel());
    mf::ToFloat(t->dtype, t->data, values.size(), values.data());
    params += t->numel();
  }
  FUZZ_CHECK(params == (*ck)->parameter_count(), "parameter_count %llu != %llu",
             static_cast<unsigned long long>((*ck)->parameter_count()),
             static_cast<unsigned long long>(params));
  if ((*ck)->config().tie_word_embeddings) {
    FUZZ_CHECK((*ck)->Find("lm_head.weight") == nullptr, "tied lm_head");
  }
}

void RemoveDir() {
  ::unlink((g_dir + "/model.safetensors").c_str());
  ::unlink((g_dir + "/model.safetensors.tmp").c_str());
  ::unlink((g_dir + "/config.json").c_str());
  ::rmdir(g_dir.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 2;  // ERROR and up (Open warns of a missing MTP head)
  g_verbose = std::getenv("SPECSERVE_FUZZ_VERBOSE") != nullptr;
  // $TMPDIR (run.sh points it into tools/fuzz/out: a crash skips atexit),
  // else /dev/shm, else /tmp.
  const char* tmpdir = std::getenv("TMPDIR");
  std::string tmpl = tmpdir != nullptr && *tmpdir != '\0' ? tmpdir
                     : ::access("/dev/shm", W_OK) == 0    ? "/dev/shm"
                                                          : "/tmp";
  tmpl += "/specserve_fuzz_model_XXXXXX";
  FUZZ_CHECK(::mkdtemp(tmpl.data()) != nullptr, "mkdtemp");
  g_dir = tmpl;
  std::ofstream(g_dir + "/config.json") << kMicroConfig;
  FUZZ_CHECK(mf::LoadModelConfig(g_dir).ok(), "the micro config is invalid");
  std::atexit(RemoveDir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  bool safetensors = false;
  CheckSafetensors(data, size, &safetensors);
  CheckConfig(std::string(reinterpret_cast<const char*>(data), size));
  if (safetensors) CheckCheckpoint(data, size);
  return 0;
}
