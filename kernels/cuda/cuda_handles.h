// Move-only RAII owners of CUDA runtime handles used by the CUDA backend,
// its tests and benchmarks: a stream, an event, device memory and pinned
// host memory. Each is created by a factory returning absl::StatusOr and
// releases its handle in the destructor (errors there are logged, not
// returned: destructors cannot fail).
#ifndef SPECSERVE_KERNELS_CUDA_CUDA_HANDLES_H_
#define SPECSERVE_KERNELS_CUDA_CUDA_HANDLES_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_status.h"

namespace specserve::kernels::cuda {

// Owns one handle of type H, released by Release(H) when non-null.
template <typename H, void (*Release)(H)>
class UniqueHandle {
 public:
  UniqueHandle() = default;
  explicit UniqueHandle(H h) : h_(h) {}
  ~UniqueHandle() { reset(); }
  UniqueHandle(UniqueHandle&& o) noexcept : h_(std::exchange(o.h_, H{})) {}
  UniqueHandle& operator=(UniqueHandle&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, H{});
    }
    return *this;
  }
  UniqueHandle(const UniqueHandle&) = delete;
  UniqueHandle& operator=(const UniqueHandle&) = delete;

  H get() const { return h_; }
  explicit operator bool() const { return h_ != H{}; }
  void reset() {
    if (h_ != H{}) Release(std::exchange(h_, H{}));
  }

 private:
  H h_{};
};

void ReleaseStream(cudaStream_t s);
void ReleaseEvent(cudaEvent_t e);
void ReleaseDeviceMemory(void* p);
void ReleasePinnedMemory(void* p);
void ReleaseGraph(cudaGraph_t g);
void ReleaseGraphExec(cudaGraphExec_t g);

using CudaStream = UniqueHandle<cudaStream_t, ReleaseStream>;
using CudaEvent = UniqueHandle<cudaEvent_t, ReleaseEvent>;
using DeviceMemory = UniqueHandle<void*, ReleaseDeviceMemory>;
using PinnedMemory = UniqueHandle<void*, ReleasePinnedMemory>;
using CudaGraph = UniqueHandle<cudaGraph_t, ReleaseGraph>;
using CudaGraphExec = UniqueHandle<cudaGraphExec_t, ReleaseGraphExec>;

// A non-blocking stream (no implicit sync with the legacy default stream).
absl::StatusOr<CudaStream> CreateStream();
// An event; `timing` false makes it cheaper (no timestamps).
absl::StatusOr<CudaEvent> CreateEvent(bool timing);
// cudaMalloc of max(bytes, 1) bytes (not zeroed).
absl::StatusOr<DeviceMemory> AllocateDevice(size_t bytes);
// cudaMallocHost of max(bytes, 1) bytes.
absl::StatusOr<PinnedMemory> AllocatePinned(size_t bytes);

}  // namespace specserve::kernels::cuda

#endif  // SPECSERVE_KERNELS_CUDA_CUDA_HANDLES_H_
