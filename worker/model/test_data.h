// Test helpers: where repository files are at test time (Bazel runfiles, or
// the working directory when run by hand) and the HF reference fixtures
// (tests/fixtures/<name>.json) parsed into plain structs.
#ifndef SPECSERVE_WORKER_MODEL_TEST_DATA_H_
#define SPECSERVE_WORKER_MODEL_TEST_DATA_H_

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/types.h"
#include "worker/model/model.h"

namespace specserve::model::testing {

// Absolute path of a repository-relative path ("tests/models/tiny_a").
std::string RepoPath(const std::string& relative);

// Repository-relative paths of every tests/fixtures/*.json, sorted.
std::vector<std::string> FixtureFiles();

// Repository-relative model dirs under tests/models, sorted.
std::vector<std::string> TestModelDirs();

// "models/default" then TestModelDirs(): the models the GPU comparisons and
// the recorded-step tests run (DefaultModelDir() resolves the first).
std::vector<std::string> DefaultAndTestModels();

// The gtest parameter name of a repository path (the name generator of
// suites parameterised by model or fixture paths): its last component up
// to the first '.', other characters than letters and digits as '_'
// ("models/specserve-tiny-py" -> "specserve_tiny_py").
std::string PathParamName(const ::testing::TestParamInfo<std::string>& info);

// n token ids drawn uniformly from [0, vocab) with `rng`.
std::vector<int32_t> RandomTokens(int n, int vocab, std::mt19937* rng);

// Absolute path of models/default's folder. The link itself is not in
// Bazel's runfiles (they carry the folder it names).
std::string DefaultModelDir();

// Absolute path of a model parameter of DefaultAndTestModels():
// DefaultModelDir() for "models/default", RepoPath otherwise. A parameter
// may end in a KV cache or recurrent state suffix (WithKvCache,
// WithRecurrentState), which names no folder.
std::string ModelDirOf(const std::string& param);

// `model` as a test parameter whose backend keeps its KV caches in `dtype`
// ("tests/models/tiny_a@bf16_kv"), so a suite covers both cache types on
// any backend; KvCacheDTypeOf reads it back (nullopt: the backend default).
std::string WithKvCache(const std::string& model, kernels::DType dtype);
std::optional<kernels::DType> KvCacheDTypeOf(const std::string& param);

// Likewise for the recurrent state type ("tests/models/tiny_a@bf16_state",
// Backend::RecurrentStateDType); RecurrentStateDTypeOf reads it back.
std::string WithRecurrentState(const std::string& model, kernels::DType dtype);
std::optional<kernels::DType> RecurrentStateDTypeOf(const std::string& param);

// A new state of `m` (`capacity` positions, verify rounds of up to
// `verify_columns`); nullptr with a test failure when it cannot be made.
std::unique_ptr<ModelState> NewStateOrFail(Model* m, int capacity,
                                           int verify_columns);

struct MtpChain {
  int32_t start_token = 0;
  std::vector<int32_t> draft_ids;          // [k]
  std::vector<std::vector<float>> logits;  // [k][V]
};

struct FixturePrompt {
  std::vector<int32_t> ids;                // [T]
  std::vector<std::vector<float>> logits;  // [T][V]
  std::vector<int32_t> greedy;             // generated continuation
  std::vector<float> greedy_margin;        // top1 − top2 per generated step
  std::vector<std::vector<float>> mtp_logits;  // [T−1][V]
  bool has_mtp_chain = false;
  MtpChain mtp_chain;
};

struct Fixture {
  std::string name;   // file stem
  std::string model;  // repository-relative model dir
  std::vector<FixturePrompt> prompts;
};

absl::StatusOr<Fixture> LoadFixture(const std::string& relative_path);

}  // namespace specserve::model::testing

#endif  // SPECSERVE_WORKER_MODEL_TEST_DATA_H_
