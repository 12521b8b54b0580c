// MakeTestBackend for the CPU test targets: a CpuBackend that records, so
// the model's recorded steps (CUDA graphs on the GPU) run in CI too.
#include "kernels/cpu/cpu_backend.h"
#include "worker/model/test_backend.h"

namespace specserve::model::testing {

std::unique_ptr<kernels::Backend> MakeTestBackend(std::string*) {
  kernels::cpu::CpuBackendOptions options;
  options.recording = true;
  return std::make_unique<kernels::cpu::CpuBackend>(options);
}

const char* TestBackendName() { return "cpu"; }

}  // namespace specserve::model::testing
