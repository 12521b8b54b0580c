// The fixture the model property tests share (batch_test, exactness_test,
// recorded_steps_test and their CUDA builds): this binary's test backend
// (test_backend.h), the model of the test's parameter loaded on it, seeded
// random tokens, new states, linear-layer states, and byte-for-byte
// comparisons of float buffers.
//
//   class MyTest : public testing::ModelTest {
//    protected:
//     MyTest() : ModelTest({.seed = 1, .capacity = 96, .verify_columns = 8}) {}
//   };
#ifndef SPECSERVE_WORKER_MODEL_MODEL_TEST_FIXTURE_H_
#define SPECSERVE_WORKER_MODEL_MODEL_TEST_FIXTURE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "worker/model/model.h"

namespace specserve::model::testing {

// Byte-for-byte equality: n floats at a and b; the first n of a (false when
// a holds fewer) and b; a and b whole (false when their sizes differ).
bool SameBytes(const float* a, const float* b, size_t n);
bool SameBytes(const std::vector<float>& a, const float* b, size_t n);
bool SameBytes(const std::vector<float>& a, const std::vector<float>& b);

struct ModelTestOptions {
  uint32_t seed = 0;               // of rng_ (RandomTokens)
  int capacity = 0;                // positions of NewState() without one
  int verify_columns = 0;          // verify columns of every NewState
  bool require_recording = false;  // fail unless the backend CanRecord()
};

// Parameterised by a model: SetUp makes the test backend (skipping the test
// when this binary's backend cannot run here) and loads ModelDir(GetParam())
// on it.
class ModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  explicit ModelTest(const ModelTestOptions& options)
      : options_(options), rng_(options.seed) {}

  void SetUp() override;

  // The model dir of a parameter; ModelDirOf(param) unless overridden.
  virtual std::string ModelDir(const std::string& param);

  // n token ids drawn uniformly from the model's vocabulary with rng_.
  std::vector<int32_t> RandomTokens(int n);

  // A new state of model_ (or of `m`) with `capacity` positions (the
  // options' capacity without one) and the options' verify columns; nullptr
  // with a test failure when it cannot be made.
  std::unique_ptr<ModelState> NewState();
  std::unique_ptr<ModelState> NewState(int capacity);
  std::unique_ptr<ModelState> NewState(Model* m);
  std::unique_ptr<ModelState> NewState(Model* m, int capacity);

  // Prefills `prompt` onto `s` (nothing for an empty prompt), asserting
  // success.
  void Prefill(ModelState* s, const std::vector<int32_t>& prompt);

  // Every linear layer's state (column < 0: committed), concatenated.
  std::vector<float> LinearStates(const ModelState& s, int column = -1);

  const ModelTestOptions options_;
  std::string dir_;                            // the loaded model's dir
  std::unique_ptr<kernels::Backend> backend_;  // this binary's test backend
  std::unique_ptr<Model> model_;
  int V_ = 0, H_ = 0, num_linear_ = 0;  // vocab, hidden, linear layers
  std::mt19937 rng_;
};

}  // namespace specserve::model::testing

#endif  // SPECSERVE_WORKER_MODEL_MODEL_TEST_FIXTURE_H_
