// Device helpers shared by the CUDA backend's kernels: weight element
// widening, activation functions and fixed-order warp reductions. Included
// by the .cu files only.
//
// Exactness habits used throughout:
//  - Activations use the accurate libdevice functions (expf, log1pf, sinf...),
//    never the fast intrinsics, so results track the CPU oracle closely.
//  - Where a CPU op multiplies then adds in separate steps (it is compiled
//    with -ffp-contract=off), the kernel uses __fmul_rn/__fadd_rn so nvcc
//    cannot contract it into an fma; where the order is our own (matmul,
//    attention, GDN), the fma is explicit (fmaf).
//  - Reductions across lanes use a xor butterfly: every lane ends with the
//    same bits (a+b == b+a), and the tree depends only on the warp size.
#ifndef SPECSERVE_KERNELS_CUDA_COMMON_CUH_
#define SPECSERVE_KERNELS_CUDA_COMMON_CUH_

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/types.h"

namespace specserve::kernels::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float Bf16ToFloat(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

__device__ __forceinline__ float F16ToFloat(uint16_t h) {
  return __half2float(__ushort_as_half(h));  // exact widening
}

// Element i of a weight/table of dtype D, widened to fp32 (scalar load).
template <DType D>
__device__ __forceinline__ float LoadElem(const void* base, int64_t i) {
  if constexpr (D == DType::kF32) {
    return __ldg(static_cast<const float*>(base) + i);
  } else if constexpr (D == DType::kBF16) {
    return Bf16ToFloat(__ldg(static_cast<const unsigned short*>(base) + i));
  } else {
    return F16ToFloat(__ldg(static_cast<const unsigned short*>(base) + i));
  }
}

// Eight consecutive weight elements as raw bits: 16 bytes for 16-bit types,
// 32 for fp32. Loaded with 16-byte accesses; `base + i` must be 16-byte
// aligned.
template <DType D>
struct Raw8 {
  static constexpr int kVecs = D == DType::kF32 ? 2 : 1;
  uint4 v[kVecs];
};

template <DType D>
__device__ __forceinline__ Raw8<D> LoadRaw8(const void* base, int64_t i) {
  Raw8<D> r;
  if constexpr (D == DType::kF32) {
    const uint4* p =
        reinterpret_cast<const uint4*>(static_cast<const float*>(base) + i);
    r.v[0] = __ldg(p);
    r.v[1] = __ldg(p + 1);
  } else {
    r.v[0] = __ldg(reinterpret_cast<const uint4*>(
        static_cast<const unsigned short*>(base) + i));
  }
  return r;
}

__device__ __forceinline__ void Half2Bits(uint32_t w, DType d, float* lo,
                                          float* hi) {
  if (d == DType::kBF16) {
    *lo = __uint_as_float(w << 16);
    *hi = __uint_as_float(w & 0xffff0000u);
  } else {
    *lo = F16ToFloat(static_cast<uint16_t>(w & 0xffffu));
    *hi = F16ToFloat(static_cast<uint16_t>(w >> 16));
  }
}

// Widens a Raw8 to eight floats (element order preserved).
template <DType D>
__device__ __forceinline__ void Widen8(const Raw8<D>& r, float (&f)[8]) {
  if constexpr (D == DType::kF32) {
    f[0] = __uint_as_float(r.v[0].x);
    f[1] = __uint_as_float(r.v[0].y);
    f[2] = __uint_as_float(r.v[0].z);
    f[3] = __uint_as_float(r.v[0].w);
    f[4] = __uint_as_float(r.v[1].x);
    f[5] = __uint_as_float(r.v[1].y);
    f[6] = __uint_as_float(r.v[1].z);
    f[7] = __uint_as_float(r.v[1].w);
  } else {
    Half2Bits(r.v[0].x, D, &f[0], &f[1]);
    Half2Bits(r.v[0].y, D, &f[2], &f[3]);
    Half2Bits(r.v[0].z, D, &f[4], &f[5]);
    Half2Bits(r.v[0].w, D, &f[6], &f[7]);
  }
}

// Same formulas as kernels/cpu/elementwise.h.
__device__ __forceinline__ float Sigmoid(float x) {
  return 1.0f / __fadd_rn(1.0f, expf(-x));
}
__device__ __forceinline__ float Silu(float x) {
  return x / __fadd_rn(1.0f, expf(-x));
}
// One SwiGLU output (the Swiglu op and the matmul's fused SwiGLU).
__device__ __forceinline__ float SwigluElem(float gate, float up) {
  return __fmul_rn(Silu(gate), up);
}
__device__ __forceinline__ float Softplus(float x) {
  return x > 20.0f ? x : log1pf(expf(x));
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1)
    v = __fadd_rn(v, __shfl_xor_sync(kFullMask, v, m));
  return v;
}

__device__ __forceinline__ double WarpSumD(double v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1)
    v = __dadd_rn(v, __shfl_xor_sync(kFullMask, v, m));
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, m));
  return v;
}

// Block-wide double sum in a fixed order (warp butterflies, then the warp
// sums in warp order), the same in every thread. sm: THREADS / 32 doubles,
// free on entry (the first barrier lets a previous reduction's readers
// finish).
template <int THREADS>
__device__ __forceinline__ double BlockSumD(double v, double* sm) {
  v = WarpSumD(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) sm[warp] = v;
  __syncthreads();
  double r = 0.0;
  for (int w = 0; w < THREADS / 32; ++w) r = __dadd_rn(r, sm[w]);
  return r;
}

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Slice tables (several sessions' calls in one launch: a PrefillBatch pass)
// hold this many slices, as kernel parameters; a call with more runs
// `launch` once per part of at most this many.
constexpr int kMaxLaunchSlices = 32;
template <typename P, typename Launch>
absl::Status ForEachLaunchPart(absl::Span<const P> slices, Launch launch) {
  for (size_t i = 0; i < slices.size(); i += kMaxLaunchSlices) {
    if (absl::Status s = launch(slices.subspan(i, kMaxLaunchSlices)); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// Programmatic dependent launch: the backend's kernels are launched with
// LaunchPdl and start with PdlBegin: the kernel waits until the previous
// grid has finished and its writes are visible (each kernel waits for its
// predecessor before it exits, so ordering stays transitive), and lets the
// next kernel launch at once, hiding its launch latency. Before its wait a
// kernel may only read weights, which no kernel of a step writes (uploads
// end before any later kernel starts: copy.cu), and prefetch (PrefetchL2):
// the tensor-core matmul fills its weight ring there, and the fused delta
// rule, AttentionInputs and the one-row attention take their weights or
// prefetch their states there, off the chain between two matmuls.
__device__ __forceinline__ void PdlLetNextLaunch() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
// Waits until the previous grid has finished and its writes are visible (a
// no-op for a plain launch).
__device__ __forceinline__ void PdlWait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
__device__ __forceinline__ void PdlBegin() {
  PdlLetNextLaunch();
  PdlWait();
}

// A hint: the 128-byte line at `p` into L2. It reads no value, so a kernel
// may issue it before its wait for data an earlier kernel may still write
// (L2 is where the GPU's memory is coherent: the loads after the wait see
// the latest values); its loads then hit L2 instead of queueing for HBM
// behind the next matmul's weight preload.
__device__ __forceinline__ void PrefetchL2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Entry i of a session table (the per-row pointers a session batch uploads
// with its step), read past L1 (ld.cg). It may be read before the
// programmatic wait: the table is an upload, written before any later
// kernel starts (copy.cu), and ld.cg leaves no L1 line to go stale.
template <typename T>
__device__ __forceinline__ T* TableEntry(T* const* table, int64_t i) {
  return reinterpret_cast<T*>(
      __ldcg(reinterpret_cast<const unsigned long long*>(table) + i));
}

// kernel<<<grid, block, smem, stream>>>(args...) as a programmatic
// dependent of the previous kernel, in clusters of cluster.x × cluster.y
// blocks when cluster.x > 0 (grid.x, grid.y multiples); errors surface
// through cudaGetLastError (LaunchStatus) like a <<<>>> launch.
template <typename... Params, typename... Args>
void LaunchPdlCluster(void (*kernel)(Params...), dim3 grid, dim3 block,
                      dim3 cluster, size_t smem, cudaStream_t stream,
                      Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.numAttrs = 1;
  if (cluster.x > 0) {
    attr[1].id = cudaLaunchAttributeClusterDimension;
    attr[1].val.clusterDim.x = cluster.x;
    attr[1].val.clusterDim.y = cluster.y;
    attr[1].val.clusterDim.z = 1;
    cfg.numAttrs = 2;
  }
  cfg.attrs = attr;
  (void)cudaLaunchKernelEx(&cfg, kernel, static_cast<Args&&>(args)...);
}

// The same without clusters.
template <typename... Params, typename... Args>
void LaunchPdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
               cudaStream_t stream, Args&&... args) {
  LaunchPdlCluster(kernel, grid, block, dim3(0, 0, 0), smem, stream,
                   static_cast<Args&&>(args)...);
}

}  // namespace specserve::kernels::cuda

#endif  // SPECSERVE_KERNELS_CUDA_COMMON_CUH_
