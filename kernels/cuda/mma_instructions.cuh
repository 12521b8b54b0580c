// The tensor-core instructions of the bf16 matmul (matmul_mma.cu), shared
// with tools/cuda_bench/mma_order_probe.cu, which checks on the GPU that
// wgmma sums a k16 slice with mma.sync's bits through these same wrappers.
// sm_90a.
#ifndef SPECSERVE_KERNELS_CUDA_MMA_INSTRUCTIONS_CUH_
#define SPECSERVE_KERNELS_CUDA_MMA_INSTRUCTIONS_CUH_

#include <cstdint>

namespace specserve::kernels::cuda {

// c += A·B over k16: mma.sync m16n8k16, bf16 in, fp32 accumulators in the
// C layout (rows g, g+8 × columns 2q, 2q+1 of lane 4g+q).
__device__ __forceinline__ void Mma(float (&c)[4], uint32_t a0, uint32_t a1,
                                    uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Shared-memory matrix descriptor, no swizzle, base offset 0: `lbo`/`sbo`
// are the byte distances between core matrices (8 rows × 16 bytes)
// adjacent along K and along M/N.
__device__ __forceinline__ uint64_t WgmmaNoSwizzleDesc(const void* smem,
                                                       uint32_t lbo,
                                                       uint32_t sbo) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return static_cast<uint64_t>((addr >> 4) & 0x3fff) |
         static_cast<uint64_t>(lbo >> 4) << 16 |
         static_cast<uint64_t>(sbo >> 4) << 32;
}

// wgmma (warpgroup): D[64 rows][64 columns] += A·B over one k16 slice, A
// from registers in mma.sync's A layout (per warp: its 16 rows), B from
// shared memory at `desc`. D in mma.sync's C layout per warp and N-tile of
// 8: d[n][0..3].
__device__ __forceinline__ void Wgmma64(float (&d)[8][4], uint32_t a0,
                                        uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint64_t desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
      "{%32,%33,%34,%35}, %36, 1, 1, 1, 0;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

// Closes the wgmma group issued since the last commit.
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Waits until at most N of this warp's wgmma groups are pending.
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void WgmmaCommitAndWait() {
  WgmmaCommit();
  WgmmaWait<0>();
}

}  // namespace specserve::kernels::cuda

#endif  // SPECSERVE_KERNELS_CUDA_MMA_INSTRUCTIONS_CUH_
