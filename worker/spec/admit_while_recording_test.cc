// Sessions admitted while other sessions decode, on a backend that records
// step shapes (CUDA graphs on the GPU, the recording CPU backend in CI): a
// new session's caches are allocated and zeroed while some batch shape may
// be recording, and neither the admission nor the step may fail for it
// ("Allocate cannot be recorded"), nor may the recording pick up the new
// session's backend work, nor its frees when it is dropped again.
#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/model.h"
#include "worker/model/test_backend.h"
#include "worker/model/test_data.h"
#include "worker/spec/model_executor.h"
#include "worker/spec/spec_engine.h"

namespace specserve::spec {
namespace {

class AdmitWhileRecordingTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    backend_ = model::testing::MakeTestBackend(&why);
    if (backend_ == nullptr) GTEST_SKIP() << why;
    if (!backend_->CanRecord()) GTEST_SKIP() << "backend does not record";
    auto loaded = model::Model::Load(model::testing::ModelDirOf(GetParam()),
                                     backend_.get());
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    model_ = std::move(*loaded);
    model_->set_use_graphs(true);
  }
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::Model> model_;
};

TEST_P(AdmitWhileRecordingTest, AdmissionsNeverCollideWithARecording) {
  ModelExecutor executor(model_.get());
  SpecEngine engine(&executor);
  const int vocab = model_->config().vocab_size;
  constexpr int kDecoders = 3;
  constexpr int kAdmissions = 400;
  std::atomic<bool> admitting{true};
  std::vector<std::string> errors(kDecoders + 1);

  // Decoders: plain greedy bursts whose batch compositions change as they
  // drift apart, so new step shapes keep being recorded.
  std::vector<std::thread> decoders;
  for (int d = 0; d < kDecoders; ++d) {
    decoders.emplace_back([&, d] {
      std::mt19937 rng(100 + d);
      std::vector<int32_t> prompt(4 + d);
      for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % vocab);
      auto s = engine.Admit("dec" + std::to_string(d), 1024, prompt,
                            std::nullopt, /*speculative=*/false);
      if (!s.ok()) {
        errors[d] = s.status().ToString();
        return;
      }
      while (admitting.load() && (*s)->committed_len() + 8 < 1024) {
        BurstParams p;
        p.max_new = 1 + static_cast<int>(rng() % 4);
        auto r = engine.RunBurst(
            s->get(), p, [](absl::Span<const int32_t>) { return true; });
        if (!r.ok()) {
          errors[d] = r.status().ToString();
          return;
        }
      }
    });
  }
  // The admitter: new sessions (speculative ones allocate draft state too),
  // each with a short prompt, while the decoders run.
  {
    std::mt19937 rng(7);
    for (int i = 0; i < kAdmissions && errors[kDecoders].empty(); ++i) {
      std::vector<int32_t> prompt(1 + rng() % 6);
      for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % vocab);
      auto s = engine.Admit("new" + std::to_string(i), 64 + (i % 5) * 64,
                            prompt, std::nullopt, /*speculative=*/i % 2 == 0);
      if (!s.ok()) errors[kDecoders] = s.status().ToString();
    }
  }
  admitting.store(false);
  for (std::thread& t : decoders) t.join();
  for (size_t i = 0; i < errors.size(); ++i) {
    EXPECT_EQ(errors[i], "") << (i < kDecoders ? "decoder " : "admitter ") << i;
  }
  // Every admitted session was dropped again on the admitter's thread while
  // the decoders recorded: its frees must not have broken a recording.
  EXPECT_EQ(model_->graph_stats().failed, 0)
      << "recordings failed (a free landed in a capture?)";
  EXPECT_GT(model_->graph_stats().recorded, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, AdmitWhileRecordingTest,
                         ::testing::Values("tests/models/tiny_a",
                                           "models/default"),
                         model::testing::PathParamName);

}  // namespace
}  // namespace specserve::spec
