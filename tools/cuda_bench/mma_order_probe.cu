// Does one wgmma (sm_90a, A in registers, B in shared memory) accumulate a
// k16 slice with the same bits as the m16n8k16 mma.sync the matmul kernel
// uses? Row invariance across the matmul's mma.sync paths (up to 32 rows)
// and its wgmma path (33-64 rows) needs exactly that, for every column
// count N. It calls the matmul's own instruction wrappers
// (kernels/cuda/mma_instructions.cuh), plus an N = 8 wgmma of its own.
//
// The probe multiplies bf16 A[64][K] by B[K][N] (N = 8 and 64) into fp32 in
// one warpgroup both ways, k16 slice after k16 slice from C = 0, with
// values spread over 2^±20 so that any difference in the order or width of
// the in-instruction sums shows in the low bits. It first checks the wgmma
// result against a double reference for each of two readings of the
// descriptor's byte offsets (LBO/SBO), then counts outputs whose bits differ
// from mma.sync. Prints one line per case; exit status 0 when both
// instructions agree bit for bit everywhere.
//
// Build (sm_90a): bazel build --config=cuda //tools/cuda_bench:mma_order_probe
// (tools/cuda_bench.sh prepare builds and carries it).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/mma_instructions.cuh"

namespace {

using specserve::kernels::cuda::Mma;
using specserve::kernels::cuda::Wgmma64;
using specserve::kernels::cuda::WgmmaCommitAndWait;
using specserve::kernels::cuda::WgmmaFence;
using specserve::kernels::cuda::WgmmaNoSwizzleDesc;

#define PROBE_CUDA(x)                                                              \
  do {                                                                             \
    cudaError_t e = (x);                                                           \
    if (e != cudaSuccess) {                                                        \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
      std::exit(2);                                                                \
    }                                                                              \
  } while (0)

constexpr int kM = 64;

__device__ __forceinline__ uint32_t Pack(const __nv_bfloat16* p) {
  uint32_t lo = *reinterpret_cast<const uint16_t*>(p);
  uint32_t hi = *reinterpret_cast<const uint16_t*>(p + 1);
  return lo | (hi << 16);
}

// A fragment of rows [16w, 16w+16) and k [k0, k0+16), mma.m16n8k16 layout
// (also wgmma's register-A layout per warp).
__device__ __forceinline__ void LoadA(const __nv_bfloat16* a, int K, int w, int lane, int k0,
                                      uint32_t (&r)[4]) {
  const int g = lane >> 2, q = lane & 3;
  const __nv_bfloat16* r0 = a + (16 * w + g) * K + k0 + 2 * q;
  const __nv_bfloat16* r1 = r0 + 8 * K;
  r[0] = Pack(r0);
  r[1] = Pack(r1);
  r[2] = Pack(r0 + 8);
  r[3] = Pack(r1 + 8);
}

// mma.sync: each warp its 16 rows, N/8 column tiles. b is [N][K] (K-major).
template <int N>
__global__ void MmaSyncKernel(const __nv_bfloat16* a, const __nv_bfloat16* b, int K, float* d) {
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  float acc[N / 8][4] = {};
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t ar[4];
    LoadA(a, K, w, lane, k0, ar);
    for (int n = 0; n < N / 8; ++n) {
      const __nv_bfloat16* bc = b + (8 * n + g) * K + k0 + 2 * q;
      const uint32_t b0 = Pack(bc), b1 = Pack(bc + 8);
      Mma(acc[n], ar[0], ar[1], ar[2], ar[3], b0, b1);
    }
  }
  for (int n = 0; n < N / 8; ++n) {
    for (int i = 0; i < 4; ++i) {
      const int row = 16 * w + g + (i >> 1) * 8, col = 8 * n + 2 * q + (i & 1);
      d[row * N + col] = acc[n][i];
    }
  }
}

// wgmma at N = 8 (the matmul itself runs N = 64: Wgmma64).
__device__ __forceinline__ void Wgmma8(float (&d)[1][4], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, 1, 1, 1, 0;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}

// wgmma: one warpgroup. Each k16 slice of B goes to shared memory as
// no-swizzle core matrices (8 n × 8 k, 128 contiguous bytes): core (nb, kb)
// at byte (nb·2 + kb)·128, so K-adjacent cores are 128 bytes apart and
// N-adjacent ones 256. `lbo`/`sbo` are the descriptor's reading of that.
template <int N>
__global__ void WgmmaKernel(const __nv_bfloat16* a, const __nv_bfloat16* b, int K, float* d,
                            uint32_t lbo, uint32_t sbo) {
  // (padded: a wrong reading of the offsets must not read past the array)
  __shared__ __align__(128) __nv_bfloat16 bs[N * 16 + 4096];
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  float acc[N / 8][4] = {};
  for (int k0 = 0; k0 < K; k0 += 16) {
    __syncthreads();
    for (int i = threadIdx.x; i < N * 16; i += blockDim.x) {
      const int n = i / 16, k = i % 16;
      bs[((n / 8) * 2 + k / 8) * 64 + (n % 8) * 8 + k % 8] = b[n * K + k0 + k];
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    uint32_t ar[4];
    LoadA(a, K, w, lane, k0, ar);
    WgmmaFence();
    const uint64_t desc = WgmmaNoSwizzleDesc(bs, lbo, sbo);
    if constexpr (N == 8) {
      Wgmma8(acc, ar, desc);
    } else {
      static_assert(N == 64, "N = 8 or 64");
      Wgmma64(acc, ar[0], ar[1], ar[2], ar[3], desc);
    }
    WgmmaCommitAndWait();
  }
  // D layout: like mma.sync's C per warp, N/8 column tiles of 4 values.
  for (int n = 0; n < N / 8; ++n) {
    for (int i = 0; i < 4; ++i) {
      const int row = 16 * w + g + (i >> 1) * 8, col = 8 * n + 2 * q + (i & 1);
      d[row * N + col] = acc[n][i];
    }
  }
}

float Spread(std::mt19937& rng, int span) {
  std::uniform_real_distribution<float> m(1.0f, 2.0f);
  std::uniform_int_distribution<int> e(-span, span);
  std::bernoulli_distribution neg(0.5);
  return (neg(rng) ? -1.0f : 1.0f) * std::ldexp(m(rng), e(rng));
}

template <int N>
bool RunCase(int K, int span, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<__nv_bfloat16> ha(kM * K), hb(N * K);
  std::vector<float> fa(kM * K), fb(N * K);
  for (int i = 0; i < kM * K; ++i) {
    ha[i] = __float2bfloat16(Spread(rng, span));
    fa[i] = __bfloat162float(ha[i]);
  }
  for (int i = 0; i < N * K; ++i) {
    hb[i] = __float2bfloat16(Spread(rng, span));
    fb[i] = __bfloat162float(hb[i]);
  }
  __nv_bfloat16 *da, *db;
  float *d_sync, *d_wg;
  PROBE_CUDA(cudaMalloc(&da, ha.size() * 2));
  PROBE_CUDA(cudaMalloc(&db, hb.size() * 2));
  PROBE_CUDA(cudaMalloc(&d_sync, kM * N * 4));
  PROBE_CUDA(cudaMalloc(&d_wg, kM * N * 4));
  PROBE_CUDA(cudaMemcpy(da, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
  PROBE_CUDA(cudaMemcpy(db, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
  std::vector<float> sync(kM * N), wg(kM * N);
  MmaSyncKernel<N><<<1, 128>>>(da, db, K, d_sync);
  PROBE_CUDA(cudaMemcpy(sync.data(), d_sync, sync.size() * 4, cudaMemcpyDeviceToHost));
  // Scale of each output: Σ|a·b|, for a relative check against the exact sum.
  std::vector<double> ref(kM * N), mag(kM * N);
  for (int r = 0; r < kM; ++r) {
    for (int c = 0; c < N; ++c) {
      double s = 0, m = 0;
      for (int k = 0; k < K; ++k) {
        const double p = static_cast<double>(fa[r * K + k]) * fb[c * K + k];
        s += p;
        m += std::fabs(p);
      }
      ref[r * N + c] = s;
      mag[r * N + c] = m;
    }
  }
  auto max_err = [&](const std::vector<float>& v) {
    double e = 0;
    for (int i = 0; i < kM * N; ++i) e = std::fmax(e, std::fabs(v[i] - ref[i]) / mag[i]);
    return e;
  };
  bool same_all = true;
  const uint32_t readings[2][2] = {{128, 256}, {256, 128}};
  for (const auto& rd : readings) {
    PROBE_CUDA(cudaMemset(d_wg, 0, kM * N * 4));
    WgmmaKernel<N><<<1, 128>>>(da, db, K, d_wg, rd[0], rd[1]);
    PROBE_CUDA(cudaGetLastError());
    PROBE_CUDA(cudaMemcpy(wg.data(), d_wg, wg.size() * 4, cudaMemcpyDeviceToHost));
    const double err = max_err(wg);
    int differ = 0;
    for (int i = 0; i < kM * N; ++i) differ += std::memcmp(&wg[i], &sync[i], 4) != 0;
    const bool layout_ok = err < 1e-5;
    std::printf("N=%-3d K=%-5d span=2^%-3d seed=%-3u lbo=%u sbo=%u: wgmma err %.2e (%s), "
                "mma.sync err %.2e, outputs differing in bits: %d of %d\n",
                N, K, span, seed, rd[0], rd[1], err, layout_ok ? "layout right" : "layout wrong",
                max_err(sync), differ, kM * N);
    if (layout_ok) same_all &= differ == 0;
  }
  cudaFree(da);
  cudaFree(db);
  cudaFree(d_sync);
  cudaFree(d_wg);
  return same_all;
}

}  // namespace

int main() {
  bool same = true;
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    for (int span : {0, 8, 20}) {
      same &= RunCase<8>(16, span, seed);
      same &= RunCase<8>(1024, span, seed);
      same &= RunCase<64>(16, span, seed);
      same &= RunCase<64>(1024, span, seed);
    }
  }
  std::printf("wgmma vs mma.sync: %s\n", same ? "bit-identical in every case where the layout "
                                               "reading is right"
                                             : "DIFFERENT bits");
  return same ? 0 : 1;
}
