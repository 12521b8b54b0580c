// Causal prefill attention of one session's rows on the tensor cores
// (LaunchPrefillAttention, ops.h): the math of kernels/attention.h with q, k
// and v rounded to bf16 (__float2bfloat16_rn), as flash attention with an
// fp32 online softmax.
//
// Algorithm. A block owns 128 (query row, head) pairs that read one KV head:
// G = 2 heads × 64 consecutive rows when the GQA group is even, else 1 head ×
// 128 rows. Each of its 8 warps owns 16 rows of one head; warps 0-3 and 4-7
// are two warpgroups of 64 rows. The block walks the key blocks [0, 64),
// [64, 128), ... up to the one holding its last row's position. Per block:
//  1. (barrier) Each warpgroup issues S = q·kᵀ (64 × 64, fp32) as head_dim/16
//     asynchronous wgmma from shared memory (q and k in the 128-byte-swizzled
//     K-major layout), and while the tensor cores run, the threads stage the
//     block's values and the next block's keys (below).
//  2. Each warp scales its S in fp32, sets keys past each row's position to
//     -inf and updates its rows' running max m, sum l and output o (16 ×
//     head_dim fp32, head_dim/2 registers a lane), P = exp(S − m).
//  3. (barrier) o += P·V with mma.sync m16n8k16, P rounded to bf16 and V
//     read by ldmatrix.trans, while the threads stage the next block's keys.
// The output is o · (1 / l) (⊙ sigmoid(gate)), the exact kernel's formulas,
// l summed over a row's 4 lanes at the end.
//
// Staging. Each thread copies 4-element pieces of the cache (cp.async;
// 16 bytes of an fp32 cache, 8 of a bf16 one) into its own 16-byte slots
// of a ring in shared memory and, half a key block later, converts its own
// pieces to bf16 (a bf16 cache's are already) in the k or v tile (no barrier
// guards the ring; the bytes in flight wait in shared memory, not in
// registers). Keys are copied during step 1 and converted during step 3 of the
// block before theirs; values are copied during step 3 of the block before and
// converted during step 1 of their own. Rows past the tile's last position are
// zeros.
//
// Row invariance. A row's arithmetic depends only on its q row, its position
// and the cache rows 0..position: the key blocks sit at fixed absolute
// positions, are visited in order, and every wgmma, mma, max, sum and exp of
// a row reads only that row's data (a matrix instruction's output row
// depends on its A row alone, in a fixed internal order). Where a block
// ends past a row's position, the masked keys give p = exp(-inf) = 0: m
// stays (the block's max of the unmasked keys cannot lower it), the rescale
// factor is exp(m − m) = 1 exactly, l and o gain exact zeros; a row with no
// visible key in a block (position before it) therefore ends with the bits
// it would have if the block were skipped, which its warpgroup does when all
// its rows are before it. The -inf of a row's first block (m before any key)
// never meets another -inf: exp(m − m_new) is taken with m_new finite, or
// against 0. So T, first_position and the row's place in its tile change no
// bit; nothing is split over keys and there are no atomics (deterministic).
//
// Sizes. Keys per block 64: S is 32 registers a lane and a wgmma of N = 64.
// 128 pairs per block: every key block loaded from L2 (fp32, 2 × 64 ×
// head_dim × 4 bytes) serves 128 rows (at head_dim 256 about 2.6 TB/s from
// L2 at 200 TFLOP/s); 16 rows a warp keep o at head_dim/2 registers, so 8
// warps (launch_bounds 256, 1) fit the register file. Shared memory: q of
// the 128 pairs and one k and one v tile (bf16), and the staging ring
// (head_dim/16 slots a thread: one tile's fp32 values in flight) =
// 768·head_dim bytes + 1 KB of alignment (193 KB at 256). The v tile's 16-byte
// chunks are XOR-swizzled by (row & 7) so that ldmatrix and the staging stores
// meet no bank conflicts. Blocks go longest tile first.
//
// Slices. LaunchPrefillAttentionSlices runs several sessions' rows (a
// PrefillBatch pass) as one grid: up to kMaxLaunchSlices slices a launch,
// each slice's blocks a contiguous range, the slice with the most keys to
// walk first. A block takes its slice's rows, positions, q, caches and
// output from the table and does exactly what the slice's own launch would
// (row invariance above): the bits do not depend on the grouping. A short
// slice over a long history (a suffix after a shared prefix) is few blocks
// that each walk every key block; grouping fills the GPU with them.
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/mma_instructions.cuh"
#include "kernels/cuda/ops.h"

namespace specserve::kernels::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpRows = 16;  // query rows of one warp (the mma's M)
constexpr int kBlockPairs = kWarps * kWarpRows;  // (row, head) pairs a block
constexpr int kKeys = 64;                        // keys per key block
constexpr int kKeyTiles = kKeys / 8;             // S's n8 tiles

// Rows and positions are int on the device.
constexpr int64_t kMaxPositions = INT_MAX - kKeys;

template <int D>
struct Shape {
  static constexpr int kSteps = D / 16;  // k16 steps of q·kᵀ
  static constexpr int kQuads = D / 4;   // 4-float pieces a row
  // A thread's 4-float pieces of a key block's keys (and of its values):
  // quad tid % kQuads of rows tid / kQuads + c·kRowStep.
  static constexpr int kPieces = kKeys * kQuads / kThreads;
  static constexpr int kRowStep = kThreads / kQuads;
  static constexpr int kTileBytes = kKeys * D * 2;
  static constexpr int kQBytes = kBlockPairs * D * 2;
  // q, keys, values, then each thread's kPieces 16-byte staging slots.
  // (+1 KB: the base rounded up to the swizzle's 1024-byte alignment)
  static constexpr int kSmemBytes =
      kQBytes + 2 * kTileBytes + kPieces * kThreads * 16 + 1024;
  static_assert(kPieces == kSteps, "one piece per k16 step of q·kᵀ");
  static_assert(kBlockPairs * kQuads % kThreads == 0, "q pieces");
};

// How the launch cuts the call (fixed by the shape, never by T's bits).
struct Tiling {
  int heads_per_block;  // G: 2 when the GQA group is even, else 1
  int tiles;            // query tiles of kBlockPairs / G rows
  bool q_vec;           // q rows and heads 16-byte aligned
};

// Several sessions' rows in one launch (LaunchPrefillAttentionSlices): slice
// i owns blocks [block0[i], block0[i + 1]) and reads its own rows, caches and
// output through these fields in place of p's; count 0 is one slice, p's.
// A block's arithmetic is what the one-slice launch of its slice gives it.
struct SliceTable {
  int count;
  int block0[kMaxLaunchSlices + 1];
  int tiles[kMaxLaunchSlices];
  int rows[kMaxLaunchSlices];
  int first_position[kMaxLaunchSlices];
  const float* q[kMaxLaunchSlices];
  const float* gate[kMaxLaunchSlices];
  const void* k_cache[kMaxLaunchSlices];
  const void* v_cache[kMaxLaunchSlices];
  float* out[kMaxLaunchSlices];
};

__device__ __forceinline__ uint32_t SmemAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Byte offset of element 4·quad of row r in a shared tile of D bf16 a row:
// 16-byte chunk quad / 2 of the row, XOR-swizzled by r & 7.
template <int D>
__device__ __forceinline__ uint32_t QuadOffset(int r, int quad) {
  return r * (D * 2) + ((((quad >> 1) ^ (r & 7)) << 4) | ((quad & 1) << 3));
}

// Byte offset of element 4·quad of row r in the wgmma operand layout of a
// tile of R rows × D bf16 (K-major, 128-byte swizzle): atoms of 8 rows ×
// 128 bytes (64 elements), the 16-byte chunks of row r XOR-swizzled by
// r & 7; atoms 1024 bytes apart down the rows, and the next 64 elements of
// every row R·128 bytes further. The tile must be 1024-byte aligned.
constexpr uint32_t kAtomRow = 128;
template <int R>
__device__ __forceinline__ uint32_t Sw128Offset(int r, int quad) {
  const int j = quad >> 1;
  return (j >> 3) * (R * kAtomRow) + r * kAtomRow + (((j & 7) ^ (r & 7)) << 4) +
         (quad & 1) * 8;
}

// The descriptor of k16 step c of rows at `rows` (an 8-row multiple of a
// tile of R rows in Sw128Offset's layout): 128-byte swizzle, 1024 bytes
// between 8-row atoms, the step's 32 bytes inside its atom.
template <int R>
__device__ __forceinline__ uint64_t Sw128Desc(uint32_t rows, int c) {
  const uint32_t addr = rows + (c >> 2) * (R * kAtomRow) + (c & 3) * 32;
  return static_cast<uint64_t>((addr >> 4) & 0x3fff) |
         static_cast<uint64_t>(1) << 16 |  // (unused with this swizzle)
         static_cast<uint64_t>(1024 >> 4) << 32 |
         static_cast<uint64_t>(1) << 62;
}

// wgmma (warpgroup): d[64 rows][64 columns] += A·B over one k16 slice, A
// and B from shared memory (descriptors, K-major), d in mma.sync's C layout
// per warp and n8 tile.
__device__ __forceinline__ void WgmmaSS(float (&d)[kKeyTiles][4], uint64_t a,
                                        uint64_t b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
      "%32, %33, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(a), "l"(b));
}
// Orders this thread's st.shared before later tensor-core (async proxy)
// reads of the same bytes (with a barrier between).
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void LdMatrix4Trans(uint32_t (&r)[4],
                                               uint32_t addr) {
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(addr));
}

// (lo, hi) rounded to bf16, lo in the low half (the lower column).
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Four consecutive floats at src (zeros when !valid; 16-byte load when vec).
__device__ __forceinline__ float4 LoadQuad(const float* src, bool valid,
                                           bool vec) {
  if (!valid) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (vec) return __ldcg(reinterpret_cast<const float4*>(src));
  return make_float4(__ldcg(src), __ldcg(src + 1), __ldcg(src + 2),
                     __ldcg(src + 3));
}

// Four floats from src into shared memory at dst, asynchronously (zeros
// when !valid: nothing is read); one 16-byte copy when kVec.
template <bool kVec>
__device__ __forceinline__ void CopyQuad(uint32_t dst, const float* src,
                                         bool valid) {
  if constexpr (kVec) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
                 "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      asm volatile(
          "cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst + 4 * i),
          "l"(src + i), "r"(valid ? 4 : 0)
          : "memory");
    }
  }
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Until at most N of this thread's newest copy groups are in flight.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ float4 LoadShared(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr));
  return v;
}

__device__ __forceinline__ void StoreQuad(uint32_t addr, float4 v) {
  asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(addr),
               "r"(PackBf16(v.x, v.y)), "r"(PackBf16(v.z, v.w)));
}

// Four cache elements from src into shared memory at dst, asynchronously
// (zeros when !valid): fp32 as CopyQuad; bf16 as 8 bytes (one copy when
// kVec: 8-byte aligned, else two 4-byte copies).
template <bool kVec>
__device__ __forceinline__ void CopyPiece(uint32_t dst, const float* src,
                                          bool valid) {
  CopyQuad<kVec>(dst, src, valid);
}
template <bool kVec>
__device__ __forceinline__ void CopyPiece(uint32_t dst,
                                          const __nv_bfloat16* src,
                                          bool valid) {
  if constexpr (kVec) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst),
                 "l"(src), "r"(valid ? 8 : 0)
                 : "memory");
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      asm volatile(
          "cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst + 4 * i),
          "l"(src + 2 * i), "r"(valid ? 4 : 0)
          : "memory");
    }
  }
}

// A staged piece (CopyPiece) into a bf16 tile at addr: fp32 rounded to bf16
// (__float2bfloat16_rn), bf16 as it is: the same bits, since a bf16 cache
// holds the fp32 values rounded the same way.
__device__ __forceinline__ void StagedToTile(uint32_t addr, uint32_t slot,
                                             float) {
  StoreQuad(addr, LoadShared(slot));
}
__device__ __forceinline__ void StagedToTile(uint32_t addr, uint32_t slot,
                                             __nv_bfloat16) {
  uint32_t lo, hi;
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n"
               : "=r"(lo), "=r"(hi)
               : "r"(slot));
  asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(addr), "r"(lo),
               "r"(hi));
}

// The online softmax of one key block (keys kb..kb+63) for a warp's 16
// rows, given S = q·kᵀ in C fragments (s[i][e]: row g + 8·(e / 2), key
// kb + 8i + 2·q4 + e % 2): scales S, masks keys past each row's position
// (when `mask`), updates the running max m and the lane's partial sums l,
// rescales o, and leaves P = exp(S − m) in s.
template <int D>
__device__ __forceinline__ void OnlineSoftmax(
    float (&s)[kKeyTiles][4], float (&o)[D / 8][4], float (&m)[2],
    float (&l)[2], int kb, bool mask, const int (&pos)[2], float scale) {
  const int q4 = threadIdx.x & 3;
  float block_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int i = 0; i < kKeyTiles; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = __fmul_rn(s[i][e], scale);
      if (mask && kb + 8 * i + 2 * q4 + (e & 1) > pos[e >> 1]) x = -INFINITY;
      s[i][e] = x;
      block_max[e >> 1] = fmaxf(block_max[e >> 1], x);
    }
  }
  float base[2], corr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = block_max[r];
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 2));
    const float m_new = fmaxf(m[r], mx);
    // -inf only while the row has seen no key: then everything is 0.
    base[r] = m_new == -INFINITY ? 0.0f : m_new;
    corr[r] = expf(__fsub_rn(m[r], base[r]));  // 1 exactly if m stays
    m[r] = m_new;
  }
  float sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < kKeyTiles; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[i][e] = expf(__fsub_rn(s[i][e], base[e >> 1]));
      sum[e >> 1] = __fadd_rn(sum[e >> 1], s[i][e]);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = fmaf(l[r], corr[r], sum[r]);
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] = __fmul_rn(o[n][e], corr[e >> 1]);
  }
}

// kVec: the cache rows are 16-byte aligned (one copy per piece).
template <typename KvT, int D, bool kVec>
__global__ void __launch_bounds__(kThreads, 1)
    PrefillAttentionKernel(const __grid_constant__ AttentionParams p,
                           Tiling tiling,
                           const __grid_constant__ SliceTable st) {
  using S = Shape<D>;
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t q_sm = (SmemAddress(smem) + 1023) & ~1023u;
  const uint32_t kv_sm = q_sm + S::kQBytes;  // k tile, v tile, staging

  // The block's slice: its place among the slice's blocks and the slice's
  // own fields (p's when the launch is one slice).
  int block = static_cast<int>(blockIdx.x), tiles = tiling.tiles;
  int rows = static_cast<int>(p.rows);
  int first = static_cast<int>(p.first_position);
  const float* q_base = p.q;
  const float* gate_base = p.gate;
  const void* k_base = p.k_cache;
  const void* v_base = p.v_cache;
  float* out_base = p.out;
  if (st.count > 0) {
    int i = 0;
    while (i + 1 < st.count && st.block0[i + 1] <= block) ++i;
    block -= st.block0[i];
    tiles = st.tiles[i];
    rows = st.rows[i];
    first = st.first_position[i];
    q_base = st.q[i];
    gate_base = st.gate[i];
    k_base = st.k_cache[i];
    v_base = st.v_cache[i];
    out_base = st.out[i];
  }

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int heads = tiling.heads_per_block;
  const int tile_rows = kBlockPairs / heads;
  const int warps_per_head = kWarps / heads;
  const int head_groups = static_cast<int>(p.num_heads) / heads;
  const int tile = tiles - 1 - block / head_groups;
  const int h0 = block % head_groups * heads;
  const int64_t kvh = h0 / (p.num_heads / p.num_kv_heads);
  const int row0 = tile * tile_rows;
  const int last_key = first + min(row0 + tile_rows, rows) - 1;
  const int key_blocks = last_key / kKeys + 1;

  // This thread's pieces: quad `quad` of rows row_base + c·kRowStep, so a
  // warp loads whole 128-byte lines and its 8-byte stores (half a warp: 128
  // bytes of one row) meet no bank conflict in either layout.
  const int quad = tid % S::kQuads;
  const int row_base = tid / S::kQuads;

  // q of the block's pairs: shared row R holds row R % 16 of warp R / 16,
  // in the wgmma layout.
#pragma unroll 4
  for (int c = 0; c < kBlockPairs * S::kQuads / kThreads; ++c) {
    const int r = row_base + c * S::kRowStep;
    const int w = r / kWarpRows;
    const int t = row0 + w % warps_per_head * kWarpRows + r % kWarpRows;
    const int64_t h = h0 + w / warps_per_head;
    const float* src =
        q_base + t * p.q_row_stride + h * p.q_head_stride + 4 * quad;
    StoreQuad(q_sm + Sw128Offset<kBlockPairs>(r, quad),
              LoadQuad(src, t < rows, tiling.q_vec));
  }

  // Staging. A thread copies its pieces (cp.async, fp32) into its own slots
  // of the staging ring and converts them into the bf16 tiles itself half a
  // key block later: no barrier guards the ring, and the bytes in flight
  // wait in shared memory, not in registers. Block j + 1's keys are copied
  // during block j's q·kᵀ and converted during its P·V; its values are
  // copied during that P·V and converted during block j + 1's q·kᵀ. Every
  // step is one commit group, so the piece of kPieces groups ago is always
  // complete after cp.async.wait_group kPieces − 1. k_at and v_at point at
  // the thread's next piece: each piece is kRowStep rows past the one
  // before, so after kPieces they point into the next key block. Nothing
  // branches: past the last key block the copies are zeros (key > last_key)
  // and the conversions fill tiles nobody reads.
  const int64_t row_step = S::kRowStep * p.kv_row_stride;
  const KvT* k_at = static_cast<const KvT*>(k_base) +
                    row_base * p.kv_row_stride + kvh * D + 4 * quad;
  const KvT* v_at = static_cast<const KvT*>(v_base) +
                    row_base * p.kv_row_stride + kvh * D + 4 * quad;
  const uint32_t k_tile = kv_sm, v_tile = kv_sm + S::kTileBytes;
  const uint32_t stage_sm = kv_sm + 2 * S::kTileBytes + 16 * tid;
  auto slot = [&](int c) { return stage_sm + c * (16 * kThreads); };
  // Piece c (row row_base + c·kRowStep) of the key block at kb.
  auto copy = [&](const KvT*& at, int c, int kb) {
    CopyPiece<kVec>(slot(c), at, kb + row_base + c * S::kRowStep <= last_key);
    at += row_step;
  };
  auto convert_k = [&](int c) {
    StagedToTile(k_tile + Sw128Offset<kKeys>(row_base + c * S::kRowStep, quad),
                 slot(c), KvT{});
  };
  auto convert_v = [&](int c) {
    StagedToTile(v_tile + QuadOffset<D>(row_base + c * S::kRowStep, quad),
                 slot(c), KvT{});
  };
  // Step c of a phase: converts slot c (`convert`), then copies the next
  // piece from `at` (key block kb) into it.
  auto step = [&](int c, auto convert, const KvT*& at, int kb) {
    CpAsyncWait<S::kPieces - 1>();
    convert(c);
    copy(at, c, kb);
    CpAsyncCommit();
  };
#pragma unroll
  for (int c = 0; c < S::kPieces; ++c) {
    copy(k_at, c, 0);
    CpAsyncCommit();
  }
  CpAsyncWait<0>();
#pragma unroll
  for (int c = 0; c < S::kPieces; ++c) convert_k(c);
  FenceProxyAsync();  // q and block 0's keys, read by wgmma
#pragma unroll
  for (int c = 0; c < S::kPieces; ++c) {
    copy(v_at, c, 0);
    CpAsyncCommit();
  }

  // The warp's rows and this lane's two of them (g and g + 8: the rows of
  // the mma's C fragment). A warpgroup (4 warps, 64 rows of one head)
  // computes q·kᵀ together, so it works on a key block when any of its
  // rows sees a key there; its other rows then see only masked keys, which
  // leave their bits as they were (see the top).
  const int64_t head = h0 + warp / warps_per_head;
  const int wt0 = row0 + warp % warps_per_head * kWarpRows;
  const bool warp_live = wt0 < rows;
  const int warp_first = first + wt0;
  const int wg_t0 = row0 + (warp & ~3) % warps_per_head * kWarpRows;
  const int wg_last = first + min(wg_t0 + 4 * kWarpRows, rows) - 1;
  const bool wg_live = wg_t0 < rows;
  const int g = lane >> 2, q4 = lane & 3;
  const int pos[2] = {warp_first + g, warp_first + g + 8};

  // The warpgroup's 64 q rows (A; the keys are B).
  const uint32_t q_wg = q_sm + (warp >> 2) * (4 * kWarpRows) * kAtomRow;
  // ldmatrix lane address of v (row & 7 == lane & 7), transposed as B.
  const uint32_t v_lane = v_tile + (lane & 15) * (D * 2);
  const int v_swz = (lane >> 4) ^ (lane & 7);

  float m[2] = {-INFINITY, -INFINITY};  // running max of each row
  float l[2] = {0.0f, 0.0f};            // this lane's part of the sum
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  // Key block kb, with the warpgroup's arithmetic when kCompute (else only
  // its share of the staging): one straight-line body per case. q·kᵀ runs
  // on the tensor cores (wgmma, asynchronous) while the threads stage.
  auto key_block = [&](auto compute, int kb) {
    constexpr bool kCompute = decltype(compute)::value;
    // Block kb's keys are in k_tile and every warp is done with the previous
    // block's values: v_tile takes block kb's.
    __syncthreads();
    float s[kKeyTiles][4];
    if constexpr (kCompute) {
#pragma unroll
      for (int i = 0; i < kKeyTiles; ++i)
        s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
      WgmmaFence();
#pragma unroll
      for (int c = 0; c < S::kSteps; ++c) {
        WgmmaSS(s, Sw128Desc<kBlockPairs>(q_wg, c),
                Sw128Desc<kKeys>(k_tile, c));
      }
      WgmmaCommit();
    }
#pragma unroll
    for (int c = 0; c < S::kSteps; ++c) step(c, convert_v, k_at, kb + kKeys);
    if constexpr (kCompute) {
      WgmmaWait<0>();
      OnlineSoftmax<D>(s, o, m, l, kb, kb + kKeys - 1 > warp_first, pos,
                       p.scale);
    }
    // Block kb's values are in v_tile and every warp is done with its keys:
    // k_tile takes the next block's.
    __syncthreads();
    // o += P·V: P's C fragments of keys 16kk.. are the A fragment.
#pragma unroll
    for (int kk = 0; kk < kKeyTiles / 2; ++kk) {
      uint32_t a[4];
      if constexpr (kCompute) {
        a[0] = PackBf16(s[2 * kk][0], s[2 * kk][1]);
        a[1] = PackBf16(s[2 * kk][2], s[2 * kk][3]);
        a[2] = PackBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        a[3] = PackBf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        constexpr int kPerPiece = 4 * (D / 16) / S::kPieces;
        const int at = kk * (D / 16) + dp;
        if (at % kPerPiece == 0)
          step(at / kPerPiece, convert_k, v_at, kb + kKeys);
        if constexpr (kCompute) {
          uint32_t b[4];
          LdMatrix4Trans(
              b, v_lane + kk * 16 * (D * 2) + (((2 * dp) ^ v_swz) << 4));
          Mma(o[2 * dp], a[0], a[1], a[2], a[3], b[0], b[1]);
          Mma(o[2 * dp + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
        }
      }
    }
    FenceProxyAsync();  // the next block's keys, read by wgmma
  };
  for (int j = 0; j < key_blocks; ++j) {
    const int kb = j * kKeys;
    if (wg_live && kb <= wg_last) {
      key_block(std::true_type(), kb);
    } else {
      key_block(std::false_type(), kb);
    }
  }
  if (!warp_live) return;

  // l over the row's 4 lanes (a butterfly: the same bits in each), then
  // out = o · (1 / l) (⊙ sigmoid(gate)) as the exact kernel writes it.
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = __fadd_rn(l[r], __shfl_xor_sync(kFullMask, l[r], 1));
    sum = __fadd_rn(sum, __shfl_xor_sync(kFullMask, sum, 2));
    inv[r] = 1.0f / sum;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t t = wt0 + g + 8 * r;
    if (t >= rows) continue;
    float* out = out_base + t * p.out_row_stride + head * D + 2 * q4;
    const float* gate = gate_base != nullptr
                            ? gate_base + t * p.gate_row_stride +
                                  head * p.gate_head_stride + 2 * q4
                            : nullptr;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v = __fmul_rn(o[n][2 * r + e], inv[r]);
        if (gate != nullptr) v = __fmul_rn(v, Sigmoid(gate[8 * n + e]));
        out[8 * n + e] = v;
      }
    }
  }
}

bool Aligned16(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}
bool AlignedTo(const void* ptr, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

// The fields every slice of one launch shares (the kernel reads them from
// the first slice's params).
bool SameShape(const AttentionParams& a, const AttentionParams& b) {
  return a.num_heads == b.num_heads && a.num_kv_heads == b.num_kv_heads &&
         a.head_dim == b.head_dim && a.q_row_stride == b.q_row_stride &&
         a.q_head_stride == b.q_head_stride &&
         a.gate_row_stride == b.gate_row_stride &&
         a.gate_head_stride == b.gate_head_stride &&
         a.kv_row_stride == b.kv_row_stride && a.kv_dtype == b.kv_dtype &&
         a.out_row_stride == b.out_row_stride && a.scale == b.scale;
}

// Launches slices[0..n) (n <= kMaxLaunchSlices, checked by the caller) as
// one grid, the slice with the most keys to walk first.
template <typename KvT, int D>
absl::Status Run(absl::Span<const AttentionParams> slices,
                 cudaStream_t stream) {
  const AttentionParams& p = slices[0];
  Tiling tiling;
  tiling.heads_per_block = (p.num_heads / p.num_kv_heads) % 2 == 0 ? 2 : 1;
  const int64_t head_groups = p.num_heads / tiling.heads_per_block;
  const int64_t tile_rows = kBlockPairs / tiling.heads_per_block;
  std::vector<int> order(slices.size());
  for (size_t i = 0; i < slices.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return slices[a].first_position + slices[a].rows >
           slices[b].first_position + slices[b].rows;
  });
  SliceTable st{};
  st.count = slices.size() > 1 ? static_cast<int>(slices.size()) : 0;
  int64_t blocks = 0;
  tiling.q_vec = p.q_row_stride % 4 == 0 && p.q_head_stride % 4 == 0;
  // A piece is 4 elements: one copy when both caches hold it aligned.
  constexpr uintptr_t kPiece = 4 * sizeof(KvT);
  bool kv_vec = p.kv_row_stride % 4 == 0;
  for (size_t j = 0; j < slices.size(); ++j) {
    const AttentionParams& s = slices[order[j]];
    const int64_t tiles = CeilDiv(s.rows, tile_rows);
    if (st.count > 0) {
      st.block0[j] = static_cast<int>(blocks);
      st.tiles[j] = static_cast<int>(tiles);
      st.rows[j] = static_cast<int>(s.rows);
      st.first_position[j] = static_cast<int>(s.first_position);
      st.q[j] = s.q;
      st.gate[j] = s.gate;
      st.k_cache[j] = s.k_cache;
      st.v_cache[j] = s.v_cache;
      st.out[j] = s.out;
    } else {
      tiling.tiles = static_cast<int>(tiles);
    }
    blocks += tiles * head_groups;
    if (blocks > INT_MAX) {
      return absl::UnimplementedError("prefill attention: too many blocks");
    }
    tiling.q_vec = tiling.q_vec && Aligned16(s.q);
    kv_vec =
        kv_vec && AlignedTo(s.k_cache, kPiece) && AlignedTo(s.v_cache, kPiece);
  }
  if (st.count > 0) st.block0[st.count] = static_cast<int>(blocks);
  const auto kernel = kv_vec ? PrefillAttentionKernel<KvT, D, true>
                             : PrefillAttentionKernel<KvT, D, false>;
  constexpr int kSmem = Shape<D>::kSmemBytes;
  // (per launch: the limit belongs to the current device)
  SS_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           kSmem),
      "prefill attention shared memory limit");
  kernel<<<static_cast<unsigned>(blocks), kThreads, kSmem, stream>>>(p, tiling,
                                                                     st);
  return LaunchStatus("prefill attention launch");
}

template <typename KvT>
absl::Status RunHeadDim(absl::Span<const AttentionParams> slices,
                        cudaStream_t stream) {
  switch (slices[0].head_dim) {
    case 64:
      return Run<KvT, 64>(slices, stream);
    case 128:
      return Run<KvT, 128>(slices, stream);
    case 256:
      return Run<KvT, 256>(slices, stream);
    default:  // CheckSlice refused it
      return absl::InternalError("prefill attention: unchecked head_dim");
  }
}

// What LaunchPrefillAttention refuses of one slice before any launch.
absl::Status CheckSlice(const AttentionParams& p) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (p.positions != nullptr) {
    return absl::UnimplementedError(
        "prefill attention: session batches (positions) are decode");
  }
  if (p.first_position + p.rows > kMaxPositions) {
    return absl::UnimplementedError("prefill attention: positions past 2^31");
  }
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) {
    return absl::UnimplementedError(
        absl::StrCat("prefill attention: head_dim ", p.head_dim,
                     " unsupported (64, 128 or 256)"));
  }
  if (p.kv_dtype == DType::kBF16 &&
      !(AlignedTo(p.k_cache, 4) && AlignedTo(p.v_cache, 4) &&
        p.kv_row_stride % 2 == 0)) {
    return absl::UnimplementedError(
        "prefill attention: a bf16 cache with odd rows or unaligned");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchPrefillAttention(const AttentionParams& p,
                                    cudaStream_t stream) {
  return LaunchPrefillAttentionSlices({&p, 1}, stream);
}

absl::Status LaunchPrefillAttentionSlices(
    absl::Span<const AttentionParams> slices, cudaStream_t stream) {
  if (slices.empty()) return absl::OkStatus();
  for (const AttentionParams& p : slices) {
    if (absl::Status s = CheckSlice(p); !s.ok()) return s;
    if (!SameShape(p, slices[0])) {
      return absl::InvalidArgumentError(
          "prefill attention: the slices of one call differ in heads, "
          "head_dim, strides, cache type or scale");
    }
  }
  return ForEachLaunchPart(slices, [&](absl::Span<const AttentionParams> part) {
    return part[0].kv_dtype == DType::kBF16
               ? RunHeadDim<__nv_bfloat16>(part, stream)
               : RunHeadDim<float>(part, stream);
  });
}

}  // namespace specserve::kernels::cuda
