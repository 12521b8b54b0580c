// Small host-to-device copies as a kernel argument: the bytes travel inside
// the launch, so the copy is asynchronous and needs no pinned staging (a
// cudaMemcpyAsync from pageable memory may wait for the stream); and the
// row scatter of kernels/scatter_rows.h.
#include <cstring>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/row_formulas.cuh"

namespace specserve::kernels::cuda {
namespace {

struct InlineBytes {
  unsigned char b[kInlineCopyBytes];
};

// The next kernel may launch only once the bytes are written and visible:
// kernels read their weights before their programmatic wait (the matmul's
// ring, the fused delta rule's coefficients, AttentionInputs' norm weights
// and frequencies), and small weights are uploaded here,
// so an upload must be complete before any later kernel starts.
__global__ void InlineCopyKernel(InlineBytes src, unsigned char* dst, int n) {
  PdlWait();
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src.b[i];
  __threadfence();
  __syncthreads();
  PdlLetNextLaunch();
}

constexpr int kScatterThreads = 256;

// Block (column tile, row t) copies its slice of row t.
__global__ void __launch_bounds__(kScatterThreads)
    ScatterRowsKernel(ScatterRowsParams p) {
  PdlBegin();
  const int64_t t = blockIdx.y;
  const int64_t c =
      static_cast<int64_t>(blockIdx.x) * kScatterThreads + threadIdx.x;
  if (c >= p.cols) return;
  ScatterRowDst(p, t).Store(c, p.src[t * p.src_stride + c]);
}

}  // namespace

absl::Status LaunchScatterRows(const ScatterRowsParams& p,
                               cudaStream_t stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (p.rows > 65535) {
    return absl::UnimplementedError("scatter_rows: more than 65535 rows");
  }
  const dim3 grid(static_cast<unsigned>(CeilDiv(p.cols, kScatterThreads)),
                  static_cast<unsigned>(p.rows));
  LaunchPdl(ScatterRowsKernel, grid, kScatterThreads, 0, stream, p);
  return LaunchStatus("scatter_rows launch");
}

absl::Status LaunchInlineCopy(void* dst, const void* host_src, size_t bytes,
                              cudaStream_t stream) {
  if (bytes > kInlineCopyBytes) {
    return absl::InvalidArgumentError("inline copy: too many bytes");
  }
  InlineBytes src;
  std::memcpy(src.b, host_src, bytes);
  LaunchPdl(InlineCopyKernel, 1, 128, 0, stream, src,
            static_cast<unsigned char*>(dst), static_cast<int>(bytes));
  return LaunchStatus("inline copy launch");
}

}  // namespace specserve::kernels::cuda
