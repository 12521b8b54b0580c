// The tiled partial kernel of decode/verify attention (attention.cu) for a
// bf16 KV cache: block (chunk c, KV head, row t) computes the chunk's
// partial (m, l, acc) for all G query heads of its KV head, in the format
// the combine reads (attention_chunks.cuh), with no per-key warp reduction.
//
// The chunk's keys go in tiles of kTileKeys to the block's 4 warps in turn
// (warp w: tiles w, w+4, ...). Per tile, a warp
//  1. copies the tile's K rows into shared memory (cp.async, 16 bytes a
//     lane) and loads its lanes' slices of the V rows into registers, so
//     both streams are in flight together;
//  2. scores: lane (key = lane/2, half = lane%2) sums q·k over its half of
//     the head dims in dimension order (one fmaf chain per head, q from
//     shared memory), then adds the other half's sum (one shuffle; a + b ==
//     b + a, so both lanes hold the same bits), times the scale;
//  3. online softmax per head: the tile's max (shuffles), m_new, the
//     rescale of the running acc and of the lane's partial l, p = exp(s −
//     m_new) into shared memory;
//  4. acc[h][dims] += p[key][h] · V[key][dims], keys in tile order, lane
//     owning dims [DPL·lane, DPL·lane + DPL).
// At the end each warp sums its lanes' l (a butterfly: every lane the same
// bits), and the 4 warps merge in warp order as in the per-key-group kernel.
//
// Exactness: the tiles, the lanes' roles and every sum's order depend only on
// the chunk (so only on n, attention_chunks.cuh), never on the launch: a
// verify row equals the decode of that position bit for bit, and a session
// in a batch equals it alone. The arithmetic differs from the per-key-group
// kernel (other sum orders), which is why the choice between them depends
// only on the cache's shape and type (TiledApplies), never on the rows.
#ifndef SPECSERVE_KERNELS_CUDA_ATTENTION_TILED_CUH_
#define SPECSERVE_KERNELS_CUDA_ATTENTION_TILED_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/attention_chunks.cuh"
#include "kernels/cuda/common.cuh"

namespace specserve::kernels::cuda::attention_chunks {

constexpr int kTileKeys = 16;  // keys per warp tile: two lanes a key
constexpr int kMaxTiledGroup = 8;

// The tiled kernel serves a bf16 cache whose rows and head slices are
// 16-byte aligned, head_dim 64, 128 or 256 and up to 8 query heads per KV
// head. A function of the call's shape only (see above).
inline bool TiledApplies(const AttentionParams& p) {
  const int64_t group = p.num_heads / p.num_kv_heads;
  const bool dims = p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256;
  const bool aligned = p.kv_row_stride % 8 == 0 &&
                       (p.positions != nullptr ||
                        (reinterpret_cast<uintptr_t>(p.k_cache) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(p.v_cache) % 16 == 0));
  return p.kv_dtype == DType::kBF16 && dims && aligned && group >= 1 &&
         group <= kMaxTiledGroup && p.num_heads % p.num_kv_heads == 0;
}

// DPL bf16 of a lane's V slice as one load.
template <int DPL>
struct VSlice;
template <>
struct VSlice<8> {
  using T = uint4;
};
template <>
struct VSlice<4> {
  using T = uint2;
};
template <>
struct VSlice<2> {
  using T = uint32_t;
};

template <int DPL>
__device__ __forceinline__ void WidenSlice(const typename VSlice<DPL>::T& r,
                                           float (&f)[DPL]) {
  const uint32_t* w = reinterpret_cast<const uint32_t*>(&r);
#pragma unroll
  for (int i = 0; i < DPL / 2; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ void CopyAsync16(void* smem, const void* gmem) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst),
               "l"(gmem)
               : "memory");
}
__device__ __forceinline__ void CopyAsyncWaitAll() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
}

// head_dim = 32·DPL; G query heads per KV head.
template <int DPL, int G>
__global__ void __launch_bounds__(kThreads)
    AttentionTiledPartialKernel(AttentionParams p, Batch b) {
  constexpr int kHd = 32 * DPL;
  constexpr int kHalf = kHd / 2;
  // A half row padded by 16 bytes: the 8 lanes of a shared-memory phase
  // (4 keys × 2 halves) read 8 different 16-byte bank groups.
  constexpr int kRowHalf = kHalf + 8;
  constexpr int kTileElems = kTileKeys * 2 * kRowHalf;
  static_assert(G * kWarps * kHd * 4 <= kWarps * kTileElems * 2,
                "the warps' merge fits in the K tiles' memory");
  __shared__ alignas(16) float sq[G][kHd];
  __shared__ alignas(16) __nv_bfloat16 sk[kWarps * kTileElems];
  __shared__ float sp[kWarps][kTileKeys][G];
  __shared__ float sm_m[G][kWarps], sm_l[G][kWarps];
  PdlLetNextLaunch();
  const int c = blockIdx.x;
  const int64_t kvh = blockIdx.y;
  const int64_t tl = blockIdx.z;
  const int64_t t = b.row0 + tl;
  const RowCaches rc = RowCachesOf(p, t);  // (the table: safe before the wait)
  const int nc = NumChunks(rc.n);
  const bool live = c < nc && nc <= b.max_chunks;
  const auto [begin, end] = ChunkOf(rc.n, nc, c);
  if (gridDim.z == 1 && live) PrefetchChunk(p, rc, {begin, end}, kvh);
  PdlWait();
  if (!live) return;  // whole block

  const int64_t h0 = kvh * G;
  for (int i = threadIdx.x; i < G * kHd; i += kThreads) {
    const int h = i / kHd, e = i % kHd;
    sq[h][e] = p.q[t * p.q_row_stride + (h0 + h) * p.q_head_stride + e];
  }
  __syncthreads();

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int key = lane >> 1, half = lane & 1;
  const int64_t stride = p.kv_row_stride;
  const __nv_bfloat16* k_head =
      static_cast<const __nv_bfloat16*>(rc.k) + kvh * kHd;
  const __nv_bfloat16* v_head =
      static_cast<const __nv_bfloat16*>(rc.v) + kvh * kHd;
  __nv_bfloat16* tile = sk + warp * kTileElems;
  using VT = typename VSlice<DPL>::T;

  float m[G], l[G], acc[G][DPL];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[h][i] = 0.0f;
  }

  for (int64_t r0 = begin + warp * kTileKeys; r0 < end;
       r0 += kWarps * kTileKeys) {
    const int nk =
        static_cast<int>(end - r0 < kTileKeys ? end - r0 : kTileKeys);
    // 1. K rows into shared memory, V slices into registers.
    constexpr int kPieces = kHd / 8;  // 16-byte pieces of a row
    for (int i = lane; i < kTileKeys * kPieces; i += 32) {
      const int row = i / kPieces, piece = i % kPieces;
      const int hh = piece / (kPieces / 2), off = (piece % (kPieces / 2)) * 8;
      if (row < nk) {
        CopyAsync16(tile + (row * 2 + hh) * kRowHalf + off,
                    k_head + (r0 + row) * stride + hh * kHalf + off);
      }
    }
    VT vs[kTileKeys];
#pragma unroll
    for (int j = 0; j < kTileKeys; ++j) {
      vs[j] = j < nk ? *reinterpret_cast<const VT*>(v_head + (r0 + j) * stride +
                                                    lane * DPL)
                     : VT{};
    }
    CopyAsyncWaitAll();
    __syncwarp();
    // 2. Scores: this lane's half of the dims, then the pair's sum.
    float s[G];
#pragma unroll
    for (int h = 0; h < G; ++h) s[h] = 0.0f;
    if (key < nk) {
      const __nv_bfloat16* krow = tile + (key * 2 + half) * kRowHalf;
#pragma unroll 4
      for (int d = 0; d < kHalf; d += 8) {
        float kf[8];
        WidenSlice<8>(*reinterpret_cast<const uint4*>(krow + d), kf);
#pragma unroll
        for (int h = 0; h < G; ++h) {
          const float4 qa =
              *reinterpret_cast<const float4*>(&sq[h][half * kHalf + d]);
          const float4 qb =
              *reinterpret_cast<const float4*>(&sq[h][half * kHalf + d + 4]);
          float a = s[h];
          a = fmaf(qa.x, kf[0], a);
          a = fmaf(qa.y, kf[1], a);
          a = fmaf(qa.z, kf[2], a);
          a = fmaf(qa.w, kf[3], a);
          a = fmaf(qb.x, kf[4], a);
          a = fmaf(qb.y, kf[5], a);
          a = fmaf(qb.z, kf[6], a);
          a = fmaf(qb.w, kf[7], a);
          s[h] = a;
        }
      }
    }
    // 3. Online softmax per head.
#pragma unroll
    for (int h = 0; h < G; ++h) {
      const float dot = __fadd_rn(s[h], __shfl_xor_sync(kFullMask, s[h], 1));
      const float sc = key < nk ? __fmul_rn(dot, p.scale) : -INFINITY;
      float mx = sc;
#pragma unroll
      for (int o = 2; o < 32; o <<= 1)
        mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, o));
      // Key r0 is valid, so mx is finite (for finite inputs).
      const float corr = m[h] == -INFINITY ? 0.0f : expf(__fsub_rn(m[h], mx));
      const float pk = key < nk ? expf(__fsub_rn(sc, mx)) : 0.0f;
      l[h] = __fadd_rn(__fmul_rn(l[h], corr), half == 0 ? pk : 0.0f);
#pragma unroll
      for (int i = 0; i < DPL; ++i) acc[h][i] = __fmul_rn(acc[h][i], corr);
      m[h] = mx;
      if (half == 0) sp[warp][key][h] = pk;
    }
    __syncwarp();
    // 4. acc += p · V, keys in tile order.
#pragma unroll
    for (int j = 0; j < kTileKeys; ++j) {
      if (j < nk) {
        float vf[DPL];
        WidenSlice<DPL>(vs[j], vf);
#pragma unroll
        for (int h = 0; h < G; ++h) {
          const float pj = sp[warp][j][h];
#pragma unroll
          for (int i = 0; i < DPL; ++i) acc[h][i] = fmaf(pj, vf[i], acc[h][i]);
        }
      }
    }
    __syncwarp();  // the tile's K and p are read before the next tile's
  }

  // Merge the warps in warp order, per head (the K tiles' memory holds the
  // warps' acc: [G][kWarps][kHd] floats).
#pragma unroll
  for (int h = 0; h < G; ++h) l[h] = WarpSum(l[h]);
  __syncthreads();
  float* sacc = reinterpret_cast<float*>(sk);
#pragma unroll
  for (int h = 0; h < G; ++h) {
    if (lane == 0) {
      sm_m[h][warp] = m[h];
      sm_l[h][warp] = l[h];
    }
#pragma unroll
    for (int i = 0; i < DPL; ++i)
      sacc[(h * kWarps + warp) * kHd + lane * DPL + i] = acc[h][i];
  }
  __syncthreads();
  WriteWarpMergedPartials<G>(p, b, tl, h0, c, kHd, sm_m, sm_l, sacc, kHd);
}

}  // namespace specserve::kernels::cuda::attention_chunks

#endif  // SPECSERVE_KERNELS_CUDA_ATTENTION_TILED_CUH_
