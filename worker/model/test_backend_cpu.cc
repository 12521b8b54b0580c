// MakeTestBackend for the CPU test targets: a CpuBackend that records, so
// the model's recorded steps (CUDA graphs on the GPU) run in CI too.
#include "kernels/cpu/cpu_backend.h"
#include "worker/model/test_backend.h"

namespace specserve::model::testing {

std::unique_ptr<kernels::Backend> MakeTestBackend(
    std::string*, std::optional<kernels::DType> kv_cache_dtype,
    std::optional<kernels::DType> recurrent_state_dtype) {
  kernels::cpu::CpuBackendOptions options;
  options.recording = true;
  if (kv_cache_dtype) options.kv_cache_dtype = *kv_cache_dtype;
  if (recurrent_state_dtype) {
    options.recurrent_state_dtype = *recurrent_state_dtype;
  }
  return std::make_unique<kernels::cpu::CpuBackend>(options);
}

const char* TestBackendName() { return "cpu"; }

}  // namespace specserve::model::testing
