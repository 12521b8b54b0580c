// The backend the model and engine property tests run on, chosen at link
// time so that one test source builds into one test target per backend:
// //worker/model:test_backend_cpu gives the CPU backend (the CI oracle),
// //worker/model:test_backend_cuda (--config=cuda only) CUDA device 0.
//
//   std::string why;
//   backend_ = testing::MakeTestBackend(&why);
//   if (backend_ == nullptr) GTEST_SKIP() << why;  // e.g. no GPU visible
#ifndef SPECSERVE_WORKER_MODEL_TEST_BACKEND_H_
#define SPECSERVE_WORKER_MODEL_TEST_BACKEND_H_

#include <memory>
#include <optional>
#include <string>

#include "kernels/backend.h"

namespace specserve::model::testing {

// A fresh backend; nullptr with `*skip_reason` set when this build's backend
// cannot run here (the CUDA one without a visible GPU). A backend that
// exists but fails to start is a test failure, not a skip: it CHECK-fails.
// `kv_cache_dtype` overrides the backend's KV cache element type
// (Backend::KvCacheDType), `recurrent_state_dtype` its recurrent state type
// (Backend::RecurrentStateDType); without them the backend's defaults.
std::unique_ptr<kernels::Backend> MakeTestBackend(
    std::string* skip_reason,
    std::optional<kernels::DType> kv_cache_dtype = std::nullopt,
    std::optional<kernels::DType> recurrent_state_dtype = std::nullopt);

// "cpu" or "cuda": the backend MakeTestBackend gives in this binary.
const char* TestBackendName();

}  // namespace specserve::model::testing

#endif  // SPECSERVE_WORKER_MODEL_TEST_BACKEND_H_
