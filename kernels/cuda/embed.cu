// Embedding lookup (kernels/embed.h): out[t] = fp32(table[ids[t]]), one
// thread per output element, exact widening of bf16/f16. A table in the
// tensor-core tile layout (a tied lm_head's) is read through its index map.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/tiled_weight.cuh"

namespace specserve::kernels::cuda {
namespace {

constexpr int kThreads = 256;

template <DType D, bool TILED>
__global__ void __launch_bounds__(kThreads)
    EmbedKernel(EmbedParams p, int* error) {
  PdlBegin();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= p.dim) return;
  for (int64_t t = blockIdx.y; t < p.rows; t += gridDim.y) {
    const int32_t id = p.ids[t];
    float v;
    if (id < 0 || id >= p.vocab) {
      v = __int_as_float(0x7fc00000);  // NaN, and reported at the next sync
      if (i == 0 && error != nullptr) *error = 1;
    } else {
      v = LoadElem<D>(p.table, TILED ? TiledElement(TiledSteps(p.dim), id, i)
                                     : static_cast<int64_t>(id) * p.dim + i);
    }
    p.out[t * p.out_stride + i] = v;
  }
}

}  // namespace

absl::Status LaunchEmbed(const EmbedParams& p, int* error,
                         cudaStream_t stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  const dim3 grid(static_cast<unsigned>(CeilDiv(p.dim, kThreads)),
                  static_cast<unsigned>(p.rows < 65535 ? p.rows : 65535));
  if (p.table_layout == WeightLayout::kTensorCoreTiles) {
    if (p.table_dtype != DType::kBF16) {
      return absl::InvalidArgumentError("embed: a tiled table must be bf16");
    }
    LaunchPdl(EmbedKernel<DType::kBF16, true>, grid, kThreads, 0, stream, p,
              error);
    return LaunchStatus("embed launch");
  }
  switch (p.table_dtype) {
    case DType::kF32:
      LaunchPdl(EmbedKernel<DType::kF32, false>, grid, kThreads, 0, stream, p,
                error);
      break;
    case DType::kBF16:
      LaunchPdl(EmbedKernel<DType::kBF16, false>, grid, kThreads, 0, stream, p,
                error);
      break;
    case DType::kF16:
      LaunchPdl(EmbedKernel<DType::kF16, false>, grid, kThreads, 0, stream, p,
                error);
      break;
  }
  return LaunchStatus("embed launch");
}

}  // namespace specserve::kernels::cuda
