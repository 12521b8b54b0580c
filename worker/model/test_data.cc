#include "worker/model/test_data.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace specserve::model::testing {
namespace fs = std::filesystem;

std::string RepoPath(const std::string& relative) {
  if (const char* srcdir = std::getenv("TEST_SRCDIR")) {
    const char* ws = std::getenv("TEST_WORKSPACE");
    const std::string p =
        absl::StrCat(srcdir, "/", ws ? ws : "specserve", "/", relative);
    if (fs::exists(p)) return p;
  }
  return relative;
}

namespace {
std::vector<std::string> List(const std::string& dir, bool want_dirs,
                              const std::string& ext) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(RepoPath(dir), ec)) {
    const bool is_dir = fs::is_directory(e.path());
    if (is_dir != want_dirs) continue;
    if (!ext.empty() && e.path().extension() != ext) continue;
    out.push_back(dir + "/" + e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::vector<float>> Matrix(const nlohmann::json& j) {
  std::vector<std::vector<float>> m;
  for (const auto& row : j) m.push_back(row.get<std::vector<float>>());
  return m;
}
}  // namespace

std::vector<std::string> FixtureFiles() {
  return List("tests/fixtures", false, ".json");
}
std::vector<std::string> DefaultAndTestModels() {
  std::vector<std::string> p = {"models/default"};
  for (const std::string& d : TestModelDirs()) p.push_back(d);
  return p;
}

std::string PathParamName(const ::testing::TestParamInfo<std::string>& info) {
  const std::string& path = info.param;
  std::string name = path.substr(path.find_last_of('/') + 1);
  const size_t at = name.find('@');
  const std::string suffix = at == std::string::npos ? "" : name.substr(at + 1);
  name = name.substr(0, std::min(name.find('.'), at));
  if (!suffix.empty()) name += "_" + suffix;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

std::vector<int32_t> RandomTokens(int n, int vocab, std::mt19937* rng) {
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(*rng);
  return t;
}

std::string DefaultModelDir() {
  const std::string link = RepoPath("models/default");
  if (fs::exists(link + "/config.json")) return link;
  return RepoPath("models/specserve-tiny-py");
}

namespace {
constexpr char kBf16Kv[] = "@bf16_kv";
constexpr char kFp32Kv[] = "@fp32_kv";
constexpr char kBf16State[] = "@bf16_state";
constexpr char kFp32State[] = "@fp32_state";
bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() &&
         s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
}  // namespace

std::string WithKvCache(const std::string& model, kernels::DType dtype) {
  return model + (dtype == kernels::DType::kBF16 ? kBf16Kv : kFp32Kv);
}

std::optional<kernels::DType> KvCacheDTypeOf(const std::string& param) {
  if (EndsWith(param, kBf16Kv)) return kernels::DType::kBF16;
  if (EndsWith(param, kFp32Kv)) return kernels::DType::kF32;
  return std::nullopt;
}

std::string WithRecurrentState(const std::string& model, kernels::DType dtype) {
  return model + (dtype == kernels::DType::kBF16 ? kBf16State : kFp32State);
}

std::optional<kernels::DType> RecurrentStateDTypeOf(const std::string& param) {
  if (EndsWith(param, kBf16State)) return kernels::DType::kBF16;
  if (EndsWith(param, kFp32State)) return kernels::DType::kF32;
  return std::nullopt;
}

std::string ModelDirOf(const std::string& param) {
  const std::string model = param.substr(0, param.find('@'));
  return model == "models/default" ? DefaultModelDir() : RepoPath(model);
}

std::unique_ptr<ModelState> NewStateOrFail(Model* m, int capacity,
                                           int verify_columns) {
  auto s =
      m->NewState({.capacity = capacity, .max_verify_columns = verify_columns});
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

std::vector<std::string> TestModelDirs() {
  return List("tests/models", true, "");
}

namespace {
absl::StatusOr<Fixture> ParseFixture(const std::string& relative_path);
}  // namespace

// nlohmann's accessors throw on missing keys and wrong types; this adapter
// turns that into a Status.
absl::StatusOr<Fixture> LoadFixture(const std::string& relative_path) {
  try {
    return ParseFixture(relative_path);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(relative_path, ": ", e.what()));
  }
}

namespace {
absl::StatusOr<Fixture> ParseFixture(const std::string& relative_path) {
  std::ifstream in(RepoPath(relative_path));
  if (!in)
    return absl::NotFoundError(absl::StrCat("cannot open ", relative_path));
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(relative_path, ": bad JSON"));
  }
  Fixture f;
  f.name = fs::path(relative_path).stem().string();
  f.model = j.value("model", "");
  if (!j.contains("prompts")) {
    return absl::InvalidArgumentError(
        absl::StrCat(relative_path, ": no prompts"));
  }
  for (const auto& p : j["prompts"]) {
    FixturePrompt fp;
    fp.ids = p.at("ids").get<std::vector<int32_t>>();
    fp.logits = Matrix(p.at("logits"));
    if (p.contains("greedy"))
      fp.greedy = p["greedy"].get<std::vector<int32_t>>();
    if (p.contains("greedy_margin")) {
      fp.greedy_margin = p["greedy_margin"].get<std::vector<float>>();
    }
    if (p.contains("mtp_logits")) fp.mtp_logits = Matrix(p["mtp_logits"]);
    if (p.contains("mtp_chain") && p["mtp_chain"].is_object()) {
      const auto& c = p["mtp_chain"];
      fp.has_mtp_chain = true;
      fp.mtp_chain.start_token = c.at("start_token").get<int32_t>();
      fp.mtp_chain.draft_ids = c.at("draft_ids").get<std::vector<int32_t>>();
      fp.mtp_chain.logits = Matrix(c.at("logits"));
    }
    f.prompts.push_back(std::move(fp));
  }
  return f;
}
}  // namespace

}  // namespace specserve::model::testing
