#include "worker/model/model_test_fixture.h"

#include <cstring>

#include "worker/model/test_backend.h"
#include "worker/model/test_data.h"

namespace specserve::model::testing {

bool SameBytes(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}
bool SameBytes(const std::vector<float>& a, const float* b, size_t n) {
  return a.size() >= n && SameBytes(a.data(), b, n);
}
bool SameBytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && SameBytes(a.data(), b.data(), a.size());
}

void ModelTest::SetUp() {
  std::string why;
  backend_ = MakeTestBackend(&why, KvCacheDTypeOf(GetParam()),
                             RecurrentStateDTypeOf(GetParam()));
  if (backend_ == nullptr) GTEST_SKIP() << why;
  if (options_.require_recording) {
    ASSERT_TRUE(backend_->CanRecord()) << TestBackendName() << " cannot record";
  }
  dir_ = ModelDir(GetParam());
  auto m = Model::Load(dir_, backend_.get());
  ASSERT_TRUE(m.ok()) << dir_ << ": " << m.status();
  model_ = std::move(*m);
  const ModelConfig& c = model_->config();
  V_ = c.vocab_size;
  H_ = c.hidden_size;
  num_linear_ = c.num_hidden_layers - c.num_full_attention_layers();
}

std::string ModelTest::ModelDir(const std::string& param) {
  return ModelDirOf(param);
}

std::vector<int32_t> ModelTest::RandomTokens(int n) {
  return testing::RandomTokens(n, V_, &rng_);
}

std::unique_ptr<ModelState> ModelTest::NewState() {
  return NewState(model_.get(), options_.capacity);
}
std::unique_ptr<ModelState> ModelTest::NewState(int capacity) {
  return NewState(model_.get(), capacity);
}
std::unique_ptr<ModelState> ModelTest::NewState(Model* m) {
  return NewState(m, options_.capacity);
}
std::unique_ptr<ModelState> ModelTest::NewState(Model* m, int capacity) {
  return NewStateOrFail(m, capacity, options_.verify_columns);
}

std::vector<float> ModelTest::LinearStates(const ModelState& s, int column) {
  std::vector<float> all, rec, conv;
  for (int i = 0; i < num_linear_; ++i) {
    EXPECT_TRUE(model_->ReadLinearState(s, i, column, &rec, &conv).ok());
    all.insert(all.end(), rec.begin(), rec.end());
    all.insert(all.end(), conv.begin(), conv.end());
  }
  return all;
}

void ModelTest::Prefill(ModelState* s, const std::vector<int32_t>& prompt) {
  if (prompt.empty()) return;
  ForwardResult r;
  ASSERT_TRUE(model_->Prefill(s, prompt, {}, &r).ok());
}

}  // namespace specserve::model::testing
