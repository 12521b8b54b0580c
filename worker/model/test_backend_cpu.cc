// MakeTestBackend for the CPU test targets: the default CpuBackend.
#include "kernels/cpu/cpu_backend.h"
#include "worker/model/test_backend.h"

namespace specserve::model::testing {

std::unique_ptr<kernels::Backend> MakeTestBackend(std::string*) {
  return std::make_unique<kernels::cpu::CpuBackend>();
}

const char* TestBackendName() { return "cpu"; }

}  // namespace specserve::model::testing
