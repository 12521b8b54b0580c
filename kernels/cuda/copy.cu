// Small host-to-device copies as a kernel argument: the bytes travel inside
// the launch, so the copy is asynchronous and needs no pinned staging (a
// cudaMemcpyAsync from pageable memory may wait for the stream).
#include <cstring>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"

namespace specserve::kernels::cuda {
namespace {

struct InlineBytes {
  unsigned char b[kInlineCopyBytes];
};

__global__ void InlineCopyKernel(InlineBytes src, unsigned char* dst, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src.b[i];
}

}  // namespace

absl::Status LaunchInlineCopy(void* dst, const void* host_src, size_t bytes,
                              cudaStream_t stream) {
  if (bytes > kInlineCopyBytes) {
    return absl::InvalidArgumentError("inline copy: too many bytes");
  }
  InlineBytes src;
  std::memcpy(src.b, host_src, bytes);
  InlineCopyKernel<<<1, 128, 0, stream>>>(src, static_cast<unsigned char*>(dst),
                                          static_cast<int>(bytes));
  return LaunchStatus("inline copy launch");
}

}  // namespace specserve::kernels::cuda
