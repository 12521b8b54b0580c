// Causal GQA attention over a KV cache with the optional sigmoid output gate
// (kernels/attention.h), split over the keys in two kernels:
//  1. partial: on a bf16 cache of the common shapes the tiled kernel
//     (attention_tiled.cuh: K tiles in shared memory, no per-key warp
//     reduction; AttentionTiledApplies, by shape only), else the per-key-group
//     kernel below: block (chunk c, heads h0..h0+G-1 of one KV head, row t),
//     G = 1, 2, 3 or 6 by the launch's size (HeadsPerBlock); each head's
//     arithmetic is the same whatever G. Row t sees n = first_position
//     + t + 1 cache rows, cut into nc = min(64, ceil(n/16)) chunks of
//     ceil(n/nc) rows (16 rows: one key group per warp, so a short context
//     costs one load round trip instead of one per 16 keys). The block's 4
//     warps take groups of 4 consecutive keys in turn (warp w: groups w, w+4,
//     ...), each keeping an online softmax (running max m, sum l,
//     acc[head_dim]); the 4 warp states are merged in warp order and (m, l,
//     acc) of the chunk goes to the workspace.
//  2. combine: block (h, t) merges the chunks in chunk order and writes
//     acc/l (⊙ sigmoid(gate)).
// Everything (the chunking, the key groups, every merge) depends only on n
// and head_dim, never on T, so a verify row equals the decode of that
// position bit for bit. A lane owns head elements lane + 32·jj.
// A session batch (p.positions) reads each row's position and caches from
// the arrays; the launch is sized by max_position, and blocks past a row's
// own chunk count exit, so row t runs exactly the one-row call's code.
// A bf16 cache (p.kv_dtype) is read widened to fp32, exactly, and the same
// arithmetic follows.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/attention_chunks.cuh"
#include "kernels/cuda/attention_tiled.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"

namespace specserve::kernels::cuda {
namespace {

using namespace attention_chunks;  // NOLINT: the chunking both partial kernels
                                   // share

constexpr int kGroup = 4;  // keys per warp step
constexpr int kMaxBatchRows = 65535;

// The most visible rows any of rows [row0, row0+n) can have.
int64_t MaxVisible(const AttentionParams& p, int64_t row0, int64_t n) {
  return p.positions != nullptr ? p.max_position + 1
                                : p.first_position + row0 + n;
}

// One cache element as fp32 (a bf16 element widens exactly).
__device__ __forceinline__ float CacheElem(const float* x) { return *x; }
__device__ __forceinline__ float CacheElem(const __nv_bfloat16* x) {
  return __bfloat162float(*x);
}

// G query heads of one KV head per block (heads h0 .. h0+G-1): the keys and
// values are loaded once for the G heads, and each head's arithmetic is
// exactly the one-head block's (the same keys per warp, the same fmaf and
// warp-sum order, the same merges), so G does not change any bits.
template <typename KvT, int DPL, int G>
__global__ void __launch_bounds__(kThreads)
    AttentionPartialKernel(AttentionParams p, Batch b) {
  __shared__ float sm_m[G][kWarps], sm_l[G][kWarps];
  __shared__ float sm_acc[G][kWarps][kMaxHeadDim];
  PdlLetNextLaunch();
  const int c = blockIdx.x;
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * G;
  const int64_t tl = blockIdx.z;
  const int64_t t = b.row0 + tl;
  // (the one-row launch only, the decode step's: a verify's columns would
  // prefetch their session's rows once per column, and a session batch keeps
  // the plain path)
  const RowCaches rc = RowCachesOf(p, t);  // (the table: safe before the wait)
  const int nc = NumChunks(rc.n);
  const bool live = c < nc && nc <= b.max_chunks;
  const auto [begin, end] = ChunkOf(rc.n, nc, c);
  const int64_t kvh = h0 / (p.num_heads / p.num_kv_heads);
  if (gridDim.z == 1 && live) PrefetchChunk(p, rc, {begin, end}, kvh);
  PdlWait();
  if (!live) return;  // whole block

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int hd = static_cast<int>(p.head_dim);
  const KvT* k_cache = static_cast<const KvT*>(rc.k);
  const KvT* v_cache = static_cast<const KvT*>(rc.v);
  float qv[G][DPL];
#pragma unroll
  for (int i = 0; i < G; ++i) {
    const float* q = p.q + t * p.q_row_stride + (h0 + i) * p.q_head_stride;
#pragma unroll
    for (int jj = 0; jj < DPL; ++jj) {
      const int e = lane + 32 * jj;
      qv[i][jj] = e < hd ? q[e] : 0.0f;
    }
  }

  float m[G], l[G], acc[G][DPL];
#pragma unroll
  for (int i = 0; i < G; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int jj = 0; jj < DPL; ++jj) acc[i][jj] = 0.0f;
  }

  for (int64_t r = begin + warp * kGroup; r < end; r += kWarps * kGroup) {
    // The group's keys and values in one round trip (the values were
    // loaded after the dot products: a round trip more per group).
    float kv[kGroup][DPL], vv[kGroup][DPL];
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const int64_t rr = r + g;
      const KvT* k = k_cache + rr * p.kv_row_stride + kvh * hd;
      const KvT* v = v_cache + rr * p.kv_row_stride + kvh * hd;
#pragma unroll
      for (int jj = 0; jj < DPL; ++jj) {
        const int e = lane + 32 * jj;
        kv[g][jj] = rr < end && e < hd ? CacheElem(k + e) : 0.0f;
        vv[g][jj] = rr < end && e < hd ? CacheElem(v + e) : 0.0f;
      }
    }
    float s[G][kGroup];
#pragma unroll
    for (int i = 0; i < G; ++i) {
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        const int64_t rr = r + g;
        float part = 0.0f;
        if (rr < end) {
#pragma unroll
          for (int jj = 0; jj < DPL; ++jj) {
            const int e = lane + 32 * jj;
            if (e < hd) part = fmaf(qv[i][jj], kv[g][jj], part);
          }
        }
        const float dot = WarpSum(part);
        s[i][g] = rr < end ? __fmul_rn(dot, p.scale) : -INFINITY;
      }
    }
#pragma unroll
    for (int i = 0; i < G; ++i) {
      float mx = m[i];
#pragma unroll
      for (int g = 0; g < kGroup; ++g) mx = fmaxf(mx, s[i][g]);
      // Key r is valid, so mx is finite (for finite inputs).
      const float corr = m[i] == -INFINITY ? 0.0f : expf(__fsub_rn(m[i], mx));
      l[i] = __fmul_rn(l[i], corr);
#pragma unroll
      for (int jj = 0; jj < DPL; ++jj) acc[i][jj] = __fmul_rn(acc[i][jj], corr);
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        if (r + g < end) {
          const float pg = expf(__fsub_rn(s[i][g], mx));
          l[i] = __fadd_rn(l[i], pg);
#pragma unroll
          for (int jj = 0; jj < DPL; ++jj) {
            const int e = lane + 32 * jj;
            if (e < hd) acc[i][jj] = fmaf(pg, vv[g][jj], acc[i][jj]);
          }
        }
      }
      m[i] = mx;
    }
  }

  // Merge the warps in warp order, per head.
#pragma unroll
  for (int i = 0; i < G; ++i) {
    if (lane == 0) {
      sm_m[i][warp] = m[i];
      sm_l[i][warp] = l[i];
    }
#pragma unroll
    for (int jj = 0; jj < DPL; ++jj) {
      const int e = lane + 32 * jj;
      if (e < hd) sm_acc[i][warp][e] = acc[i][jj];
    }
  }
  __syncthreads();
  WriteWarpMergedPartials<G>(p, b, tl, h0, c, hd, sm_m, sm_l, &sm_acc[0][0][0],
                             kMaxHeadDim);
}

// Head h of row t (local row tl) from its nc chunk partials, written to
// p.out (⊙ sigmoid(gate)): the chunks merged in chunk order. Called by all
// kThreads threads of a block (two barriers). Every load that can goes in
// the first round trip: the chunks' (m, l) pairs, the gate and the first
// kBatch chunks' partials of each thread's outputs, so the combine waits on
// memory once per batch instead of once per loop-carried load. The sums keep
// the chunk order, so the batching changes no bits. (ld.cg: each partial is
// read once.)
__device__ __forceinline__ void CombineHead(const AttentionParams& p,
                                            const Batch& b, int64_t h,
                                            int64_t tl, int64_t t, int nc) {
  constexpr int kBatch = 16;  // chunk partials in flight per output
  constexpr int kE = 2;       // outputs per thread (head_dim 256 in one pass)
  static_assert(kMaxHeadDim <= kThreads * kE, "one pass over a head's outputs");
  __shared__ float sm_e[kMaxChunks], sm_m[kMaxChunks], sm_l[kMaxChunks];
  const int hd = static_cast<int>(p.head_dim);
  const int64_t slot0 = (tl * p.num_heads + h) * b.max_chunks;
  const float* acc = b.acc + slot0 * hd;
  const float* gate = p.gate != nullptr ? p.gate + t * p.gate_row_stride +
                                              h * p.gate_head_stride
                                        : nullptr;
  float v[kE][kBatch], g[kE];
  auto load_batch = [&](int c0) {
#pragma unroll
    for (int k = 0; k < kE; ++k) {
      const int e = threadIdx.x + k * kThreads;
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        v[k][i] =
            e < hd && c0 + i < nc ? __ldcg(acc + (c0 + i) * hd + e) : 0.0f;
      }
    }
  };
  load_batch(0);
#pragma unroll
  for (int k = 0; k < kE; ++k) {
    const int e = threadIdx.x + k * kThreads;
    g[k] = gate != nullptr && e < hd ? gate[e] : 0.0f;
  }
  if (threadIdx.x < nc) {
    sm_m[threadIdx.x] = __ldcg(b.ml + (slot0 + threadIdx.x) * 2);
    sm_l[threadIdx.x] = __ldcg(b.ml + (slot0 + threadIdx.x) * 2 + 1);
  }
  __syncthreads();
  float big = -INFINITY;
  for (int c = 0; c < nc; ++c) big = fmaxf(big, sm_m[c]);
  if (threadIdx.x < nc) {
    const float mc = sm_m[threadIdx.x];
    sm_e[threadIdx.x] = mc == -INFINITY ? 0.0f : expf(__fsub_rn(mc, big));
  }
  __syncthreads();
  float sum = 0.0f;
  for (int c = 0; c < nc; ++c) sum = fmaf(sm_l[c], sm_e[c], sum);
  const float inv_sum = 1.0f / sum;
  float a[kE] = {};
  for (int c0 = 0; c0 < nc; c0 += kBatch) {
    if (c0 > 0) load_batch(c0);
#pragma unroll
    for (int k = 0; k < kE; ++k) {
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        if (c0 + i < nc) a[k] = fmaf(v[k][i], sm_e[c0 + i], a[k]);
      }
    }
  }
  float* out = p.out + t * p.out_row_stride + h * hd;
#pragma unroll
  for (int k = 0; k < kE; ++k) {
    const int e = threadIdx.x + k * kThreads;
    if (e < hd) {
      const float o = __fmul_rn(a[k], inv_sum);
      out[e] = gate != nullptr ? __fmul_rn(o, Sigmoid(g[k])) : o;
    }
  }
}

// A batch position past max_position has more chunks than the launch has
// slots: its output is NaN (the caller's error, made visible).
__device__ __forceinline__ void PoisonHead(const AttentionParams& p, int64_t h,
                                           int64_t t) {
  for (int64_t e = threadIdx.x; e < p.head_dim; e += kThreads) {
    p.out[t * p.out_row_stride + h * p.head_dim + e] =
        __int_as_float(0x7fc00000);
  }
}

__global__ void __launch_bounds__(kThreads)
    AttentionCombineKernel(AttentionParams p, Batch b) {
  PdlLetNextLaunch();
  const int64_t h = blockIdx.x;
  const int64_t tl = blockIdx.y;
  const int64_t t = b.row0 + tl;
  const int nc =
      NumChunks(RowCachesOf(p, t).n);  // (the table: safe before the wait)
  PdlWait();
  if (nc > b.max_chunks) {
    PoisonHead(p, h, t);
    return;
  }
  CombineHead(p, b, h, tl, t, nc);
}

// Query heads per partial block: the most of 6, 3, 2 that divides a KV
// head's group and still leaves at least kMinBlocks blocks for the launch's
// `slots` (rows × chunk slots); else 1. (Any choice gives the same bits.)
int HeadsPerBlock(const AttentionParams& p, int64_t slots) {
  constexpr int64_t kMinBlocks = 264;  // two per SM on an H100/H200
  const int64_t group = p.num_heads / p.num_kv_heads;
  for (int g : {6, 3, 2}) {
    if (group % g == 0 && slots * (p.num_heads / g) >= kMinBlocks) return g;
  }
  return 1;
}

// The tiled partial (attention_tiled.cuh) of all G query heads of each KV
// head: grid (chunk slots, KV heads, rows).
template <int DPL, int G>
absl::Status LaunchTiledPartialOf(const AttentionParams& p, const Batch& b,
                                  int64_t rows_here, cudaStream_t stream) {
  const dim3 grid(b.max_chunks, static_cast<unsigned>(p.num_kv_heads),
                  static_cast<unsigned>(rows_here));
  LaunchPdl(AttentionTiledPartialKernel<DPL, G>, grid, dim3(kThreads), 0,
            stream, p, b);
  return LaunchStatus("attention tiled partial launch");
}

template <int DPL>
absl::Status LaunchTiledPartialDpl(const AttentionParams& p, const Batch& b,
                                   int64_t rows_here, cudaStream_t stream) {
  switch (p.num_heads / p.num_kv_heads) {
    case 1:
      return LaunchTiledPartialOf<DPL, 1>(p, b, rows_here, stream);
    case 2:
      return LaunchTiledPartialOf<DPL, 2>(p, b, rows_here, stream);
    case 3:
      return LaunchTiledPartialOf<DPL, 3>(p, b, rows_here, stream);
    case 4:
      return LaunchTiledPartialOf<DPL, 4>(p, b, rows_here, stream);
    case 5:
      return LaunchTiledPartialOf<DPL, 5>(p, b, rows_here, stream);
    case 6:
      return LaunchTiledPartialOf<DPL, 6>(p, b, rows_here, stream);
    case 7:
      return LaunchTiledPartialOf<DPL, 7>(p, b, rows_here, stream);
    case 8:
      return LaunchTiledPartialOf<DPL, 8>(p, b, rows_here, stream);
    default:
      return absl::InternalError("attention: tiled partial group size");
  }
}

absl::Status LaunchTiledPartial(const AttentionParams& p, const Batch& b,
                                int64_t rows_here, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64:
      return LaunchTiledPartialDpl<2>(p, b, rows_here, stream);
    case 128:
      return LaunchTiledPartialDpl<4>(p, b, rows_here, stream);
    case 256:
      return LaunchTiledPartialDpl<8>(p, b, rows_here, stream);
    default:
      return absl::InternalError("attention: tiled partial head_dim");
  }
}

template <typename KvT, int DPL>
absl::Status RunBatches(const AttentionParams& p, const Workspace& ws,
                        cudaStream_t stream) {
  const size_t per_row = AttentionWorkspaceBytesPerRow(p);
  const int64_t fit = static_cast<int64_t>(ws.bytes / per_row);
  if (fit < 1) {
    return absl::ResourceExhaustedError(
        "attention: workspace too small for one row");
  }
  const int64_t batch_rows = std::min<int64_t>(fit, kMaxBatchRows);
  for (int64_t row0 = 0; row0 < p.rows; row0 += batch_rows) {
    const int64_t rows_here = std::min<int64_t>(batch_rows, p.rows - row0);
    Batch b;
    b.row0 = row0;
    b.max_chunks = NumChunks(MaxVisible(p, row0, rows_here));
    b.acc = static_cast<float*>(ws.data);
    b.ml = b.acc + rows_here * p.num_heads * b.max_chunks * p.head_dim;
    const dim3 block(kThreads);
    if (TiledApplies(p)) {
      if (absl::Status s = LaunchTiledPartial(p, b, rows_here, stream); !s.ok())
        return s;
    } else {
      const int g = HeadsPerBlock(p, rows_here * b.max_chunks);
      const dim3 grid(b.max_chunks, static_cast<unsigned>(p.num_heads / g),
                      static_cast<unsigned>(rows_here));
      auto partial = AttentionPartialKernel<KvT, DPL, 1>;
      switch (g) {
        case 6:
          partial = AttentionPartialKernel<KvT, DPL, 6>;
          break;
        case 3:
          partial = AttentionPartialKernel<KvT, DPL, 3>;
          break;
        case 2:
          partial = AttentionPartialKernel<KvT, DPL, 2>;
          break;
        default:
          break;
      }
      LaunchPdl(partial, grid, block, 0, stream, p, b);
      if (absl::Status s = LaunchStatus("attention partial launch"); !s.ok())
        return s;
    }
    const dim3 cgrid(static_cast<unsigned>(p.num_heads),
                     static_cast<unsigned>(rows_here));
    LaunchPdl(AttentionCombineKernel, cgrid, block, 0, stream, p, b);
    if (absl::Status s = LaunchStatus("attention combine launch"); !s.ok())
      return s;
  }
  return absl::OkStatus();
}

template <typename KvT>
absl::Status RunHeadDim(const AttentionParams& p, const Workspace& ws,
                        cudaStream_t stream) {
  if (p.head_dim <= 32) return RunBatches<KvT, 1>(p, ws, stream);
  if (p.head_dim <= 64) return RunBatches<KvT, 2>(p, ws, stream);
  if (p.head_dim <= 128) return RunBatches<KvT, 4>(p, ws, stream);
  return RunBatches<KvT, 8>(p, ws, stream);
}

}  // namespace

bool AttentionTiledApplies(const AttentionParams& p) { return TiledApplies(p); }

size_t AttentionWorkspaceBytesPerRow(const AttentionParams& p) {
  const int64_t chunks = NumChunks(MaxVisible(p, 0, p.rows));
  return static_cast<size_t>(p.num_heads * chunks * (p.head_dim + 2)) *
         sizeof(float);
}

absl::Status LaunchAttention(const AttentionParams& p, const Workspace& ws,
                             cudaStream_t stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (p.head_dim > kMaxHeadDim) {
    return absl::UnimplementedError("attention: head_dim > 256 unsupported");
  }
  if (p.num_heads > 65535) {
    return absl::UnimplementedError("attention: more than 65535 heads");
  }
  if (p.kv_dtype == DType::kBF16) {
    return RunHeadDim<__nv_bfloat16>(p, ws, stream);
  }
  return RunHeadDim<float>(p, ws, stream);
}

}  // namespace specserve::kernels::cuda
