#include "kernels/cuda/cuda_handles.h"

#include "glog/logging.h"

namespace specserve::kernels::cuda {
namespace {

void LogIfError(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    LOG(ERROR) << "cuda: " << what << ": " << cudaGetErrorString(err);
  }
}

}  // namespace

void ReleaseStream(cudaStream_t s) {
  LogIfError(cudaStreamDestroy(s), "cudaStreamDestroy");
}
void ReleaseEvent(cudaEvent_t e) {
  LogIfError(cudaEventDestroy(e), "cudaEventDestroy");
}
void ReleaseDeviceMemory(void* p) { LogIfError(cudaFree(p), "cudaFree"); }
void ReleasePinnedMemory(void* p) {
  LogIfError(cudaFreeHost(p), "cudaFreeHost");
}
void ReleaseGraph(cudaGraph_t g) {
  LogIfError(cudaGraphDestroy(g), "cudaGraphDestroy");
}
void ReleaseGraphExec(cudaGraphExec_t g) {
  LogIfError(cudaGraphExecDestroy(g), "cudaGraphExecDestroy");
}

absl::StatusOr<CudaStream> CreateStream() {
  cudaStream_t s = nullptr;
  SS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                          "cudaStreamCreateWithFlags");
  return CudaStream(s);
}

absl::StatusOr<CudaEvent> CreateEvent(bool timing) {
  cudaEvent_t e = nullptr;
  SS_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(
          &e, timing ? cudaEventDefault : cudaEventDisableTiming),
      "cudaEventCreateWithFlags");
  return CudaEvent(e);
}

absl::StatusOr<DeviceMemory> AllocateDevice(size_t bytes) {
  void* p = nullptr;
  SS_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc");
  return DeviceMemory(p);
}

absl::StatusOr<PinnedMemory> AllocatePinned(size_t bytes) {
  void* p = nullptr;
  SS_CUDA_RETURN_IF_ERROR(cudaMallocHost(&p, bytes == 0 ? 1 : bytes),
                          "cudaMallocHost");
  return PinnedMemory(p);
}

}  // namespace specserve::kernels::cuda
