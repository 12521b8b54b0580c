// Turns CUDA runtime errors into absl::Status for the CUDA backend's host
// code (both the .cu launchers and cuda_backend.cc). Host-only; no kernels.
#ifndef SPECSERVE_KERNELS_CUDA_CUDA_STATUS_H_
#define SPECSERVE_KERNELS_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"

namespace specserve::kernels::cuda {

// OK for cudaSuccess; otherwise INTERNAL (RESOURCE_EXHAUSTED for out of
// memory) naming `what` and the CUDA error.
inline absl::Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  std::string msg = std::string("cuda: ") + what + ": " +
                    cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                    ")";
  if (err == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(msg);
  }
  return absl::InternalError(msg);
}

// After a kernel launch: the launch-configuration error, if any. (Faults
// inside the kernel surface at the next synchronizing call.)
inline absl::Status LaunchStatus(const char* what) {
  return CudaStatus(cudaGetLastError(), what);
}

}  // namespace specserve::kernels::cuda

#define SS_CUDA_RETURN_IF_ERROR(expr, what)                     \
  do {                                                          \
    const ::absl::Status ss_cuda_status_ =                      \
        ::specserve::kernels::cuda::CudaStatus((expr), (what)); \
    if (!ss_cuda_status_.ok()) return ss_cuda_status_;          \
  } while (0)

#endif  // SPECSERVE_KERNELS_CUDA_CUDA_STATUS_H_
