// How decode/verify attention (attention.cu) cuts a row's visible keys into
// chunks, shared by its two partial kernels (the per-key-group kernel and the
// tiled bf16 kernel, attention_tiled.cuh) and the combine.
//
// Invariant: a row's chunks, and so every sum of its output, depend only on
// its visible row count n (position + 1), never on the launch's rows, on the
// other sessions of a batch or on the kernel's grid: verify == decode and
// batched == alone, bit for bit.
#ifndef SPECSERVE_KERNELS_CUDA_ATTENTION_CHUNKS_CUH_
#define SPECSERVE_KERNELS_CUDA_ATTENTION_CHUNKS_CUH_

#include <cstdint>

#include "kernels/attention.h"
#include "kernels/cuda/common.cuh"

namespace specserve::kernels::cuda::attention_chunks {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxChunks = 64;
constexpr int kMinChunkRows = 16;
constexpr int kMaxHeadDim = 256;

// n visible rows are cut into min(64, ceil(n / 16)) chunks.
__host__ __device__ inline int NumChunks(int64_t n) {
  const int64_t c = (n + kMinChunkRows - 1) / kMinChunkRows;
  return static_cast<int>(c < kMaxChunks ? c : kMaxChunks);
}

// One launch's rows and its workspace of chunk partials.
struct Batch {
  int64_t row0;    // first query row of this launch
  int max_chunks;  // chunk slots per (row, head) in the workspace
  float* acc;      // [rows][heads][max_chunks][head_dim]
  float* ml;       // [rows][heads][max_chunks][2]
};

// Row t's visible rows and caches. The session batch's table (positions,
// cache pointers) is read past L1, so it may be read before the
// programmatic wait (TableEntry, common.cuh).
struct RowCaches {
  int64_t n;  // visible rows
  const void* k;
  const void* v;
};
__device__ __forceinline__ RowCaches RowCachesOf(const AttentionParams& p,
                                                 int64_t t) {
  if (p.positions == nullptr)
    return {p.first_position + t + 1, p.k_cache, p.v_cache};
  return {int64_t{__ldcg(p.positions + t)} + 1, TableEntry(p.k_caches, t),
          TableEntry(p.v_caches, t)};
}

// Chunk c of n visible rows cut into nc chunks of equal length (the last
// may be shorter): rows [begin, end).
struct ChunkRange {
  int64_t begin;
  int64_t end;
};
__device__ __forceinline__ ChunkRange ChunkOf(int64_t n, int nc, int c) {
  const int64_t chunk = (n + nc - 1) / nc;
  const int64_t begin = c * chunk;
  return {begin, begin + chunk < n ? begin + chunk : n};
}

// Before the wait: the first rows of the block's chunk of keys and values
// (KV head kvh) into L2 (PrefetchL2: the rows were written by earlier
// steps, all but the newest, which the previous kernel writes; a hint reads
// no value).
__device__ __forceinline__ void PrefetchChunk(const AttentionParams& p,
                                              const RowCaches& rc,
                                              ChunkRange range, int64_t kvh) {
  constexpr int kRows = 64;        // rows prefetched at most
  constexpr int kLineBytes = 128;  // one L2 line
  const int64_t elem = p.kv_dtype == DType::kBF16 ? 2 : 4;
  const int64_t rows = min(range.end - range.begin, int64_t{kRows});
  const int lines =
      static_cast<int>((p.head_dim * elem + kLineBytes - 1) / kLineBytes);
#pragma unroll 1
  for (int i = threadIdx.x; i < rows * 2 * lines; i += kThreads) {
    const int64_t r = range.begin + i / (2 * lines);
    const int w = i % (2 * lines);
    const char* base = static_cast<const char*>(w < lines ? rc.k : rc.v) +
                       (r * p.kv_row_stride + kvh * p.head_dim) * elem;
    PrefetchL2(base + (w % lines) * kLineBytes);
  }
}

// The chunk partial (m, l, acc) of heads h0 .. h0+G-1 of local row tl,
// merged over the block's warps in warp order, into the workspace slot of
// chunk c. sm_m / sm_l: each warp's max and sum per head; sacc: each warp's
// unnormalised output, head i and warp w at sacc[(i·kWarps + w)·stride].
// Called by all kThreads threads after the barrier that publishes them.
template <int G>
__device__ __forceinline__ void WriteWarpMergedPartials(
    const AttentionParams& p, const Batch& b, int64_t tl, int64_t h0, int c,
    int hd, const float (&sm_m)[G][kWarps], const float (&sm_l)[G][kWarps],
    const float* sacc, int stride) {
#pragma unroll
  for (int i = 0; i < G; ++i) {
    float big = -INFINITY;
    for (int w = 0; w < kWarps; ++w) big = fmaxf(big, sm_m[i][w]);
    float ew[kWarps];
    float big_l = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      ew[w] = sm_m[i][w] == -INFINITY ? 0.0f : expf(__fsub_rn(sm_m[i][w], big));
      big_l = fmaf(sm_l[i][w], ew[w], big_l);
    }
    const int64_t slot = (tl * p.num_heads + h0 + i) * b.max_chunks + c;
    for (int e = threadIdx.x; e < hd; e += kThreads) {
      float a = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w)
        a = fmaf(sacc[(i * kWarps + w) * stride + e], ew[w], a);
      b.acc[slot * hd + e] = a;
    }
    if (threadIdx.x == 0) {
      b.ml[slot * 2] = big;
      b.ml[slot * 2 + 1] = big_l;
    }
  }
}

}  // namespace specserve::kernels::cuda::attention_chunks

#endif  // SPECSERVE_KERNELS_CUDA_ATTENTION_CHUNKS_CUH_
