// MakeTestBackend for the *_cuda_test targets: CUDA device 0, or a skip when
// no device is visible (the binary still links and runs on a GPU-less host).
#include "glog/logging.h"
#include "kernels/cuda/cuda_backend.h"
#include "worker/model/test_backend.h"

namespace specserve::model::testing {

std::unique_ptr<kernels::Backend> MakeTestBackend(
    std::string* skip_reason, std::optional<kernels::DType> kv_cache_dtype,
    std::optional<kernels::DType> recurrent_state_dtype) {
  if (kernels::cuda::CudaDeviceCount() == 0) {
    *skip_reason = "no CUDA device visible";
    return nullptr;
  }
  kernels::cuda::CudaBackendOptions options;
  if (kv_cache_dtype) options.kv_cache_dtype = *kv_cache_dtype;
  if (recurrent_state_dtype) {
    options.recurrent_state_dtype = *recurrent_state_dtype;
  }
  auto backend = kernels::cuda::CreateCudaBackend(options);
  CHECK(backend.ok()) << "a CUDA device is visible but the backend failed: "
                      << backend.status();
  return std::move(*backend);
}

const char* TestBackendName() { return "cuda"; }

}  // namespace specserve::model::testing
