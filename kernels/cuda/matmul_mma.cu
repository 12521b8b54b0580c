// The bf16-weight matmul on the tensor cores: y[T][out] (+)= x[T][in]·Wᵀ with
// fp32 x, for every T (decode, verify, batched decode, prefill), reading the
// weights once per call for T <= 64.
//
// Math. Each fp32 x element is split into `splits` bf16 terms (hi = rn(x),
// mid = rn(x − hi), lo = rn(x − hi − mid)); with 3 terms the split is exact
// (x = hi + mid + lo), with 2 it keeps 16 significant bits (relative error
// <= 2^-17, about the fp32 accumulation noise of a K >= 1000 reduction). The
// bf16 weight times each term is exact in the tensor core's fp32 products.
// The products are accumulated by mma.sync.m16n8k16 (A = 16 weight rows, B =
// 8 tokens): D[o][t] = C[o][t] + Σ_k W[o][k]·x_s[t][k] over 16 k per
// instruction.
//
// Fixed reduction order (row invariance, kernels/backend.h). Everything
// below that decides the order depends on (in, out, splits) only, never on
// T. The work is the (output tile, 64-k step) space, tile-major: tiles ×
// tile_steps steps, cut into `parts` equal contiguous ranges (MmaPlan; the
// parts are a fixed count, kPlanBlocks, not the launch's grid). A part
// covers pieces of one or more tiles; a tile is thus cut into 1..max_pieces
// K pieces at step boundaries that depend on the shape only. Within a piece,
// k advances in steps of 64 and each step runs, for split s = splits−1 .. 0
// (smallest first), four m16n8k16 instructions in k order, each
// accumulating into the same fp32 accumulator (starting at +0). A token's
// column of the instruction depends only on its own x column, and every
// column is computed by the same hardware arithmetic, so which column (or
// which of the N-tiles) a token occupies does not change its bits. Piece
// partial sums are added in piece (k) order by the last block to finish a
// tile (arrival order does not matter), then added to y when accumulating.
//
// Weights come in the tensor-core tile layout (tiled_weight.cuh), so each
// warp's step is 2 KB of contiguous memory and a part is one contiguous
// range. K permutation: within a 64-step, lane (g = lane/4, q = lane%4)
// loads the 16 k at q·16 of weight rows g and g+8 as four 16-byte chunks;
// instruction j of the step uses k = q·16 + 4j + {0,1,2,3} of them for the
// fragment slots {2q, 2q+1, 2q+8, 2q+9}. x's fragments use the same
// mapping, so the sum is over the same products; only the (fixed) order
// differs from a plain k order.
//
// Work split (stream-K): a unit is one piece, 128 outputs (8 warps × 16) ×
// the piece's K range. Every part has the same number of steps (±1), so the
// blocks finish together whatever the shape (no last round of a few
// units). The grid holds the blocks that fit at once; block b does parts b,
// b + G, ... and their pieces in k order. Each lane streams its weights
// through a RING-step register ring (RING × 32 B per row pair; 4 steps, 2 on
// the pre-split path) that runs on across units, so a block's weight stream
// never drains between units; x
// for the block's tokens is split and staged in shared memory per 256-wide
// K tile, in fragment order (conflict-free 16-byte reads). A whole tile's
// sums go to y; a piece's go to the workspace, where the last piece of its
// tile to finish adds them in piece order.
//
// Pre-split x (more than 16 tokens, when `x_frags` holds them): a first
// kernel (SplitXKernel) writes every 64-k step's fragments once (above 32
// tokens as the shared-memory B operand of wgmma); the matmul's blocks copy
// them a tile ahead into a second shared-memory stage with cp.async, so no
// block splits x or waits for its x loads between tiles, and above 32
// tokens each warpgroup multiplies its 64 rows by all the tokens per wgmma
// (x read from shared memory once per warpgroup instead of once per warp).
// Every path builds fragments with XFragments and puts every product in
// the same slot of the same k16 instruction in the same order, and wgmma
// sums a k16 slice with the bits of mma.sync (checked on the H200 by
// tools/cuda_bench/mma_order_probe.cu), so the bits do not depend on the
// path (nor on T). At 64 tokens the x fragments a block copies per step are
// as many bytes as its weights (16 KiB each); there ncu finds neither DRAM
// (35%) nor L2 (49%) nor the tensor pipe saturated (PERF.md): the kernel
// waits on its weight loads and its per-tile barrier.
//
// Fused norm (MatmulParams.norm_weight, at most kMaxFusedNormRows tokens):
// after the wait, the block computes each token's 1/rms exactly as RmsNorm
// does (rms_inv.cuh) and normalises x while staging it, so the result is
// that of RmsNorm followed by this matmul, bit for bit.
//
// Fused SwiGLU (MatmulParams.swiglu, any T): x is staged as silu(g)⊙u by
// the formula of the Swiglu op (SwigluElem), so the result is that of
// Swiglu followed by this matmul, bit for bit.
//
// Launch overlap: the kernel is a programmatic dependent of the previous
// one and lets the next kernel launch at once (griddepcontrol): its weight
// ring fills while the previous kernel drains; x, y, the workspace and the
// counters, which earlier kernels may use, are touched only after
// griddepcontrol.wait.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/matmul_mma.h"
#include "kernels/cuda/mma_instructions.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/rms_inv.cuh"
#include "kernels/cuda/tiled_weight.cuh"

namespace specserve::kernels::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 16;
constexpr int kTileOut = kWarps * kRowsPerWarp;  // outputs per unit
constexpr int kStepK = 64;                       // k per ring step
constexpr int kRing = 4;                         // steps in flight
constexpr int kMaxTokens = 64;                   // tokens per launch
constexpr int kPlanBlocks = 264;  // parts: 2 blocks per SM on 132 SMs
static_assert(kThreads == kRmsBlockThreads,
              "the fused norm reduces with the whole block");
static_assert(kWarps == kTiledWarps && kTileOut == kTiledRows &&
                  kStepK == kTiledStepK,
              "a unit's step is one tile step of the weight layout");

struct MmaArgs {
  MatmulParams p;
  int64_t t0;          // first token of this launch
  int tokens;          // tokens in this launch (<= NT·8)
  int64_t tiles;       // output tiles (kTileOut rows)
  int64_t tile_steps;  // 64-k steps per tile
  int64_t parts;       // equal ranges of the tiles × tile_steps steps
  float* partial;      // [max_pieces][tokens][out]
  int* counters;       // [tiles], zero on entry and on exit
  // Every part has its own block (grid >= parts): a split tile's piece 0,
  // always the last unit of its part, is summed by its own block (it waits
  // for the others' release counts); see the piece sums below.
  bool owner_sums = false;
};

// First step of part v (v <= parts).
__device__ __forceinline__ int64_t PartBegin(const MmaArgs& a, int64_t v) {
  return v * (a.tiles * a.tile_steps) / a.parts;
}

// The part holding `step`.
__device__ __forceinline__ int64_t PartOf(const MmaArgs& a, int64_t step) {
  return ((step + 1) * a.parts - 1) / (a.tiles * a.tile_steps);
}

// Where a block is in its sequence of units: the next step of part `part`.
struct Cursor {
  int64_t part;
  int64_t step;
};

// Part v at its start (past the end when v >= parts). No part is empty:
// parts <= steps (PlanMmaMatmul).
__device__ __forceinline__ Cursor FirstOf(const MmaArgs& a, int64_t v) {
  return Cursor{v, v < a.parts ? PartBegin(a, v) : 0};
}

// Packs rn_bf16(a) (low half) and rn_bf16(b); leaves the residuals in a, b.
__device__ __forceinline__ uint32_t SplitPair(float& a, float& b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  const uint32_t bits = *reinterpret_cast<const uint32_t*>(&h);
  a = __fsub_rn(a, __uint_as_float(bits << 16));
  b = __fsub_rn(b, __uint_as_float(bits & 0xffff0000u));
  return bits;
}

// A unit (one piece) as one lane sees it: its chunks of rows g (w0) and g+8
// (w1) from k = kbeg + q·16, in the tile layout (tiled_weight.cuh).
struct UnitView {
  bool valid = false;
  int64_t tile = 0;
  int piece = 0;   // index of this piece in its tile (k order)
  int pieces = 0;  // pieces the tile is cut into
  int64_t kbeg = 0;
  int klen = 0;     // elements in the piece
  int nsteps = 0;   // 64-k steps holding data
  int padded = 0;   // nsteps rounded up to the ring's length (its unit)
  int64_t end = 0;  // step after the piece
  const uint16_t* w0 = nullptr;
  const uint16_t* w1 = nullptr;
};

template <int RING>
__device__ __forceinline__ UnitView ViewUnit(const MmaArgs& a, Cursor c,
                                             int warp, int g, int q) {
  const MatmulParams& p = a.p;
  UnitView v;
  v.valid = c.part < a.parts;
  if (!v.valid) return v;
  v.tile = c.step / a.tile_steps;
  const int64_t tile_begin = v.tile * a.tile_steps;
  const int64_t tile_end = tile_begin + a.tile_steps;
  v.end = min(PartBegin(a, c.part + 1), tile_end);
  const int64_t first_part = PartOf(a, tile_begin);
  v.piece = static_cast<int>(c.part - first_part);
  v.pieces = static_cast<int>(PartOf(a, tile_end - 1) - first_part + 1);
  v.kbeg = (c.step - tile_begin) * kStepK;
  v.klen = static_cast<int>(min(p.in, (v.end - tile_begin) * kStepK) - v.kbeg);
  v.nsteps = static_cast<int>(v.end - c.step);
  v.padded = (v.nsteps + RING - 1) / RING * RING;
  // (c.step counts tile-major over (tile, step), as the layout does; the
  // rows past `out` in the last tile are read, as padding, and discarded)
  v.w0 = static_cast<const uint16_t*>(p.w) +
         TiledLaneChunk(c.step, warp, g, q) * int64_t{8};
  v.w1 = v.w0 + kTiledRowPlus8 * 8;
  return v;
}

// The cursor after unit `v` (which `c` points at).
__device__ __forceinline__ Cursor NextUnit(const MmaArgs& a, Cursor c,
                                           const UnitView& v) {
  if (v.end < PartBegin(a, c.part + 1)) return Cursor{c.part, v.end};
  return FirstOf(a, c.part + gridDim.x);
}

// v[0..8) = src[0..8), with two 16-byte loads when `vec`.
__device__ __forceinline__ void LoadX8(const float* src, bool vec,
                                       float (&v)[8]) {
  if (vec) {
    const float4 lo = *reinterpret_cast<const float4*>(src);
    const float4 hi = *reinterpret_cast<const float4*>(src + 4);
    v[0] = lo.x;
    v[1] = lo.y;
    v[2] = lo.z;
    v[3] = lo.w;
    v[4] = hi.x;
    v[5] = hi.y;
    v[6] = hi.z;
    v[7] = hi.w;
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = src[e];
  }
}

// store(s, fragment) for the SPLITS bf16 fragments (s = 0 is hi) of
// x[tok][k, k+8) as the matmul consumes them: the swiglu / fused-norm
// prologue applied, zeros for a token or k out of range (k >= kend). The
// staging in the kernel and the pre-split kernel both build fragments here,
// so they hold the same bits.
template <int SPLITS, typename Store>
__device__ __forceinline__ void XFragments(const MatmulParams& p,
                                           const float* xb, int tokens, int tok,
                                           int64_t k, int64_t kend, bool x_vec,
                                           bool norm, const float* inv_rms,
                                           Store&& store) {
  float v[8];
  if (tok < tokens && k < kend) {
    const float* src = xb + tok * p.x_stride + k;
    LoadX8(src, x_vec, v);
    if (p.swiglu) {  // v is the gate; the up half is `in` further on
      float up[8];
      LoadX8(src + p.in, x_vec, up);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = SwigluElem(v[e], up[e]);
    }
    if (norm) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        v[e] = NormedElem(v[e], inv_rms[tok], p.norm_weight, k + e,
                          p.norm_plus_one);
      }
    }
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = 0.0f;
  }
#pragma unroll
  for (int s = 0; s < SPLITS; ++s) {
    uint4 f;
    f.x = SplitPair(v[0], v[1]);
    f.y = SplitPair(v[2], v[3]);
    f.z = SplitPair(v[4], v[5]);
    f.w = SplitPair(v[6], v[7]);
    store(s, f);
  }
}

__device__ __forceinline__ bool XVectorLoads(const MatmulParams& p) {
  return (reinterpret_cast<uintptr_t>(p.x) % 16 == 0) &&
         (p.x_stride % 4 == 0) && (!p.swiglu || p.in % 4 == 0);
}

// Fragments of one 64-k step for NT·8 tokens, in the order the kernel reads
// them from shared memory: [SPLITS][NT][2 halves][32 lanes] uint4.
template <int NT, int SPLITS>
constexpr int kStepFragments = SPLITS* NT * 2 * 32;

// The wgmma B operand of one (64-k step, split s, instruction j): the 16
// k-slots of instruction j for NT·8 tokens as no-swizzle core matrices (8
// tokens × 8 slots, 128 contiguous bytes): core (token/8, slot/8) at byte
// (token/8 · 2 + slot/8) · 128, token%8 at 16 bytes per row. So K-adjacent
// cores are kWgmmaLbo bytes apart and token-adjacent ones kWgmmaSbo.
template <int NT>
constexpr int kWgmmaBBytes = NT * 8 * 16 * 2;
constexpr uint32_t kWgmmaLbo = 128;
constexpr uint32_t kWgmmaSbo = 256;

// The pre-split kernel multiplies with wgmma at 64 tokens (N = 64), with
// mma.sync at 32: at N = 32 a wgmma's setup is not repaid by its larger
// tile, so mma.sync is the faster of the two there (PERF.md, matmuls).
template <int NT>
constexpr bool kPresplitWgmma = NT == 8;

// Pre-split x (NT >= kPresplitMinNT): xf[step][...] = the fragments of
// 64-k step `step` of tokens [t0, t0 + tokens), built once per call instead
// of by every block. Block `step`, thread per (token, 8-wide chunk).
//
// For wgmma (kPresplitWgmma) the layout is its B operand's, [SPLITS][4
// instructions][kWgmmaBBytes], with each value in the slot its mma.sync
// fragment gives it (slots 2q, 2q+1, 2q+8, 2q+9 of instruction j hold k =
// q·16 + 4j + 0..3): the same products in the same slots, so the same bits.
// Otherwise it is the order the warps read: [SPLITS][NT][2 halves][32
// lanes] uint4. kStepFragments<NT, SPLITS> uint4 per step either way.
template <int NT, int SPLITS>
__global__ void __launch_bounds__(kThreads)
    SplitXKernel(MatmulParams p, int64_t t0, int tokens, uint4* xf) {
  PdlBegin();
  const int64_t step = blockIdx.x;
  const bool x_vec = XVectorLoads(p);
  const float* xb = p.x + t0 * p.x_stride;
  uint4* out = xf + step * kStepFragments<NT, SPLITS>;
  for (int item = threadIdx.x; item < NT * 8 * 8; item += kThreads) {
    const int tok = item >> 3, c = item & 7;  // chunk c: k = step·64 + c·8
    const int kl = c * 8;
    const int qq = (kl >> 4) & 3, h = (kl >> 3) & 1;
    const int dst_lane = (tok & 7) * 4 + qq, n = tok >> 3;
    XFragments<SPLITS>(
        p, xb, tokens, tok, step * kStepK + c * 8, p.in, x_vec, false, nullptr,
        [&](int s, uint4 f) {
          if constexpr (kPresplitWgmma<NT>) {
            // f.x, f.y: instruction 2h (slots 2q,2q+1 | 2q+8,2q+9);
            // f.z, f.w: instruction 2h + 1.
            char* b = reinterpret_cast<char*>(out) +
                      (s * 4 + 2 * h) * kWgmmaBBytes<NT> + n * 2 * 128 +
                      (tok & 7) * 16 + qq * 4;
            *reinterpret_cast<uint32_t*>(b) = f.x;
            *reinterpret_cast<uint32_t*>(b + 128) = f.y;
            *reinterpret_cast<uint32_t*>(b + kWgmmaBBytes<NT>) = f.z;
            *reinterpret_cast<uint32_t*>(b + kWgmmaBBytes<NT> + 128) = f.w;
          } else {
            out[((s * NT + n) * 2 + h) * 32 + dst_lane] = f;
          }
        });
  }
}

// The descriptor of a B operand in the layout above (kWgmmaBBytes<8> at
// `b`); Wgmma64 (mma_instructions.cuh) multiplies by it.
__device__ __forceinline__ uint64_t WgmmaDesc(const void* b) {
  return WgmmaNoSwizzleDesc(b, kWgmmaLbo, kWgmmaSbo);
}

// One 64-k step at 64 tokens: for split s = SPLITS-1 .. 0, the four k16
// instructions j in order, A from the step's weight registers w[0..3] (row
// g half 0/1, row g+8 half 0/1: the mma.sync kernel's), B from the step's
// fragments at `step` (SPLITS·4 blocks of kWgmmaBBytes<8>). The order per
// accumulator is the mma.sync kernel's.
template <int SPLITS>
__device__ __forceinline__ void WgmmaStep(float (&acc)[8][4],
                                          const uint4 (&w)[4],
                                          const char* step) {
  constexpr int kB = kWgmmaBBytes<8>;
#pragma unroll
  for (int s = SPLITS - 1; s >= 0; --s) {
    const char* b = step + s * 4 * kB;
    Wgmma64(acc, w[0].x, w[2].x, w[0].y, w[2].y, WgmmaDesc(b));
    Wgmma64(acc, w[0].z, w[2].z, w[0].w, w[2].w, WgmmaDesc(b + kB));
    Wgmma64(acc, w[1].x, w[3].x, w[1].y, w[3].y, WgmmaDesc(b + 2 * kB));
    Wgmma64(acc, w[1].z, w[3].z, w[1].w, w[3].w, WgmmaDesc(b + 3 * kB));
  }
}

__device__ __forceinline__ int LoadAcquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n"
               : "=r"(v)
               : "l"(p)
               : "memory");
  return v;
}

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst),
               "l"(gmem)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// PRESPLIT: x comes as pre-split fragments (xf, SplitXKernel), copied a
// RING-step tile ahead into a second shared-memory stage (cp.async) while
// the current tile is consumed; otherwise every block splits and stages x
// itself. With kPresplitWgmma, each warpgroup (4 warps, 64 rows) issues one
// wgmma per (split, instruction j) where each warp would issue NT mma.sync,
// reading x from shared memory once per warpgroup, not once per warp. Same
// A registers, same B slots, same order per accumulator, and wgmma sums a
// k16 slice with mma.sync's bits (tools/cuda_bench/mma_order_probe.cu,
// checked on the H200), so the bits are the same on every path.
//
// RING: weight steps in flight per lane (registers), also the steps of one
// x tile. 4 for the staged kernels; 2 for the pre-split T > 32 one, which
// then fits 128 registers and runs 2 blocks per SM. The ring depth only
// buffers: the order of the mma instructions per output is the same.
template <int NT, int SPLITS, bool PRESPLIT, int RING>
__global__ void __launch_bounds__(kThreads, (NT <= 2 || RING <= 2) ? 2 : 1)
    MmaMatmulKernel(MmaArgs a, const uint4* __restrict__ xf) {
  // [stages][RING][SPLITS][NT][2 halves][32 lanes]; 2 stages when PRESPLIT.
  extern __shared__ uint4 xs_all[];
  static_assert(PRESPLIT || RING == kRing,
                "the in-block staging fills kRing-step tiles");
  constexpr bool kWg = PRESPLIT && kPresplitWgmma<NT>;
  constexpr int kTileFragments = RING * kStepFragments<NT, SPLITS>;
  __shared__ int is_last;
  __shared__ double sm_part[8][kRmsBlockThreads / 32];
  __shared__ float sm_inv[8];  // fused norm: 1/rms of each token (NT == 1)
  PdlLetNextLaunch();
  const MatmulParams& p = a.p;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;

  // The loader runs RING steps ahead of the consumer, across units.
  Cursor lc = FirstOf(a, blockIdx.x);
  int lj = 0;
  UnitView lv = ViewUnit<RING>(a, lc, warp, g, q);
  uint4 ring[RING][4];  // per slot: row r0 half 0/1, row r1 half 0/1
  auto load_next = [&](int u) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // (k past `in` is zeros in the layout: no bound but the unit's steps)
      const int off = (lj * kTiledStepChunks + h * kTiledNextK) * 8;
      if (lv.valid && lj < lv.nsteps) {
        ring[u][h] = __ldg(reinterpret_cast<const uint4*>(lv.w0 + off));
        ring[u][2 + h] = __ldg(reinterpret_cast<const uint4*>(lv.w1 + off));
      } else {
        ring[u][h] = make_uint4(0, 0, 0, 0);
        ring[u][2 + h] = make_uint4(0, 0, 0, 0);
      }
    }
    // A unit starts at slot 0 and is padded to whole rings, so it can end
    // only at slot RING − 1: only that copy of this (unrolled) code carries
    // the advance. That keeps the hot loop a quarter of the size it has
    // with the advance in every copy (PERF.md).
    if (!lv.valid) return;
    ++lj;
    if (u == RING - 1 && lj == lv.padded) {
      lj = 0;
      lc = NextUnit(a, lc, lv);
      lv = ViewUnit<RING>(a, lc, warp, g, q);
    }
  };
#pragma unroll
  for (int u = 0; u < RING; ++u) load_next(u);
  PdlWait();  // only the weights were read before this

  const bool x_vec = XVectorLoads(p);
  const float* xb = p.x + a.t0 * p.x_stride;

  // PRESPLIT: the x loader runs one tile ahead of the consumer, across
  // units, into the other stage. Padded steps past a unit's data are not
  // copied (the consumer skips them).
  Cursor xc = FirstOf(a, blockIdx.x);
  int xkt = 0;
  auto issue_x_tile = [&](int stage) {
    if (xc.part < a.parts) {
      const UnitView v = ViewUnit<RING>(a, xc, warp, g, q);
      const int first = xkt * RING;
      const int steps = min(RING, v.nsteps - first);
      const uint4* src =
          xf + (v.kbeg / kStepK + first) *
                   static_cast<int64_t>(kStepFragments<NT, SPLITS>);
      uint4* dst = xs_all + stage * kTileFragments;
      for (int i = tid; i < steps * kStepFragments<NT, SPLITS>; i += kThreads) {
        CpAsync16(dst + i, src + i);
      }
      if (++xkt == v.padded / RING) {
        xkt = 0;
        xc = NextUnit(a, xc, v);
      }
    }
    CpAsyncCommit();  // (empty past the last tile: the group count stays
                      // uniform)
  };
  int stage = 0;
  if constexpr (PRESPLIT) issue_x_tile(0);

  // Fused norm (at most 8 tokens, so NT == 1): each token's 1/rms exactly
  // as RmsNorm computes it (rms_inv.cuh), then x is normalised as staged.
  bool fused_norm = false;
  if constexpr (NT == 1) {
    fused_norm = p.norm_weight != nullptr;
    if (fused_norm) {
      if (p.in >= kRmsBlockDim) {
        BlockInvRmsRows<8>(xb, p.x_stride, a.tokens, p.in, p.norm_eps, sm_part,
                           sm_inv);
      } else {
        if (warp < a.tokens) {
          const float inv =
              WarpInvRms(xb + warp * p.x_stride, p.in, p.norm_eps, lane);
          if (lane == 0) sm_inv[warp] = inv;
        }
        __syncthreads();
      }
    }
  }

  for (Cursor cc = FirstOf(a, blockIdx.x); cc.part < a.parts;) {
    const UnitView cv = ViewUnit<RING>(a, cc, warp, g, q);
    cc = NextUnit(a, cc, cv);
    const int64_t kend = cv.kbeg + cv.klen;
    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[n][i] = 0.0f;
    }
    for (int kt = 0; kt < cv.padded / RING; ++kt) {
      __syncthreads();  // the previous tile's fragments are consumed
      const uint4* xs = xs_all + stage * kTileFragments;
      if constexpr (PRESPLIT) {
        issue_x_tile(stage ^ 1);  // the stage consumed by the previous tile
        CpAsyncWait<1>();         // this thread's copies of the current tile
        // wgmma reads shared memory through the async proxy.
        if constexpr (kWg)
          asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        stage ^= 1;
      } else {
        // Stage x[tokens][kt's 256 k] as split bf16 fragments.
        const int64_t ktile =
            cv.kbeg + static_cast<int64_t>(kt) * (RING * kStepK);
#pragma unroll
        for (int it = 0; it < NT; ++it) {
          const int item = it * kThreads + tid;  // (token, 8-wide chunk)
          const int tok = item >> 5, c = item & 31;
          const int kl = c * 8;  // 0..255 within the tile
          const int u = kl >> 6, qq = (kl >> 4) & 3, h = (kl >> 3) & 1;
          const int dst_lane = (tok & 7) * 4 + qq, n = tok >> 3;
          XFragments<SPLITS>(
              p, xb, a.tokens, tok, ktile + c * 8, kend, x_vec, fused_norm,
              sm_inv, [&](int s, uint4 f) {
                xs_all[(((u * SPLITS + s) * NT + n) * 2 + h) * 32 + dst_lane] =
                    f;
              });
        }
      }
      __syncthreads();

#pragma unroll
      for (int u = 0; u < RING; ++u) {
        if constexpr (kWg) {
          if (kt * RING + u < cv.nsteps) {
            // (the wgmmas read ring[u]: they complete before load_next
            // refills it, and before the next tile's copy overwrites xs)
            WgmmaFence();
            WgmmaStep<SPLITS>(
                acc, ring[u],
                reinterpret_cast<const char*>(xs) +
                    u * kStepFragments<NT, SPLITS> * sizeof(uint4));
            WgmmaCommitAndWait();
          }
        } else if (kt * RING + u < cv.nsteps) {
          const uint4& wa0 = ring[u][0];
          const uint4& wa1 = ring[u][1];
          const uint4& wb0 = ring[u][2];
          const uint4& wb1 = ring[u][3];
#pragma unroll
          for (int s = SPLITS - 1; s >= 0; --s) {
#pragma unroll
            for (int n = 0; n < NT; ++n) {
              const uint4 x0 =
                  xs[(((u * SPLITS + s) * NT + n) * 2 + 0) * 32 + lane];
              const uint4 x1 =
                  xs[(((u * SPLITS + s) * NT + n) * 2 + 1) * 32 + lane];
              Mma(acc[n], wa0.x, wb0.x, wa0.y, wb0.y, x0.x, x0.y);
              Mma(acc[n], wa0.z, wb0.z, wa0.w, wb0.w, x0.z, x0.w);
              Mma(acc[n], wa1.x, wb1.x, wa1.y, wb1.y, x1.x, x1.y);
              Mma(acc[n], wa1.z, wb1.z, wa1.w, wb1.w, x1.z, x1.w);
            }
          }
        }
        load_next(u);
      }
    }

    // acc[n] = (row g, tokens 2q, 2q+1), (row g+8, tokens 2q, 2q+1) of N-tile
    // n.
    const int64_t o_base = cv.tile * kTileOut + warp * kRowsPerWarp;
    auto each_output = [&](auto&& fn) {
#pragma unroll
      for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int64_t o = o_base + g + (i >> 1) * 8;
          const int tok = n * 8 + 2 * q + (i & 1);
          if (o < p.out && tok < a.tokens) fn(o, tok, acc[n][i]);
        }
      }
    };
    if (cv.pieces == 1) {
      each_output([&](int64_t o, int tok, float v) {
        float* y = p.y + (a.t0 + tok) * p.y_stride + o;
        *y = p.accumulate ? __fadd_rn(*y, v) : v;
      });
      continue;
    }
    const int64_t o0 = cv.tile * kTileOut;
    // Piece sums, in piece order per output. With owner_sums, piece 0's
    // block sums: the other pieces are earlier units of later parts (the
    // first unit of a part, or a whole part), each written and counted with
    // a release (no round trip), so the owner, which ends its part with
    // piece 0, rarely waits; it keeps its own piece in shared memory (the x
    // stages are free after its last tile). No block waits on a block that
    // waits: only piece 0 waits, and it is the last unit of its part.
    // Otherwise the last piece to arrive (atomic count) sums.
    float* own = nullptr;  // owner_sums and piece 0: [tokens][kTileOut]
    if (a.owner_sums && cv.piece == 0) {
      if constexpr (PRESPLIT) CpAsyncWait<0>();
      __syncthreads();  // every warp is done with the x stages
      own = reinterpret_cast<float*>(xs_all);
      each_output([&](int64_t o, int tok, float v) {
        own[tok * kTileOut + (o - o0)] = v;
      });
      if (tid == 0) {
        while (LoadAcquire(&a.counters[cv.tile]) < cv.pieces - 1) {
        }
        a.counters[cv.tile] = 0;
      }
      __syncthreads();  // (thread 0's acquire, then the barrier: the pieces are
                        // visible)
    } else {
      each_output([&](int64_t o, int tok, float v) {
        a.partial[(static_cast<int64_t>(cv.piece) * a.tokens + tok) * p.out +
                  o] = v;
      });
      // Every thread's partials, then one fence and the count: the barrier
      // orders the block's stores before thread 0's fence, which is
      // cumulative (the pattern of a cooperative-groups grid sync).
      __syncthreads();
      if (a.owner_sums) {
        if (tid == 0) {
          __threadfence();
          atomicAdd(&a.counters[cv.tile], 1);  // (result unused: no round trip)
        }
        continue;
      }
      if (tid == 0) {
        __threadfence();
        is_last = atomicAdd(&a.counters[cv.tile], 1) == cv.pieces - 1;
      }
      __syncthreads();
      if (!is_last)
        continue;  // (is_last is rewritten only after two more barriers)
      __threadfence();
    }
    const int64_t piece_stride = static_cast<int64_t>(a.tokens) * p.out;
    // kE outputs per thread at a time (at 64 tokens a tile has 8192
    // outputs; at 8 tokens 1024); per output, the other pieces are loaded
    // kPB at a time, together with y's old value, so that a tile of up to
    // kPB + 1 pieces costs one round trip after the wait (the sum's tail is
    // on the call's critical path: the last block to end is a piece-0
    // owner). Each output's sum stays in piece order, then y.
    constexpr int kE = 2;
    constexpr int kPB = 8;
    const int total = a.tokens * kTileOut;
    for (int base = tid; base < total; base += kThreads * kE) {
      const float* src[kE];
      float* dst[kE];
      float sum[kE], old[kE];
      bool ok[kE];
#pragma unroll
      for (int e = 0; e < kE; ++e) {
        const int idx = base + e * kThreads;
        const int tok = idx / kTileOut;
        const int64_t o = o0 + idx % kTileOut;
        ok[e] = idx < total && o < p.out;
        src[e] = a.partial + static_cast<int64_t>(tok) * p.out + o;
        dst[e] = p.y + (a.t0 + tok) * p.y_stride + o;
        old[e] = ok[e] && p.accumulate ? *dst[e] : 0.0f;
        sum[e] = !ok[e] ? 0.0f : own != nullptr ? own[idx] : __ldcg(src[e]);
      }
      for (int s0 = 1; s0 < cv.pieces; s0 += kPB) {
        float v[kPB][kE];
#pragma unroll
        for (int i = 0; i < kPB; ++i) {
#pragma unroll
          for (int e = 0; e < kE; ++e) {
            v[i][e] = ok[e] && s0 + i < cv.pieces
                          ? __ldcg(src[e] + (s0 + i) * piece_stride)
                          : 0.0f;
          }
        }
#pragma unroll
        for (int i = 0; i < kPB; ++i) {
#pragma unroll
          for (int e = 0; e < kE; ++e) {
            if (s0 + i < cv.pieces) sum[e] = __fadd_rn(sum[e], v[i][e]);
          }
        }
      }
#pragma unroll
      for (int e = 0; e < kE; ++e) {
        if (ok[e]) *dst[e] = p.accumulate ? __fadd_rn(old[e], sum[e]) : sum[e];
      }
    }
    if (own == nullptr && tid == 0) a.counters[cv.tile] = 0;
  }
}

// Blocks of one kernel instance resident on the device at once (cached;
// every device a process uses is the same model).
template <int NT, int SPLITS, bool PRESPLIT, int RING>
int64_t ResidentBlocks(size_t smem) {
  static const int64_t blocks = [&] {
    auto kernel = MmaMatmulKernel<NT, SPLITS, PRESPLIT, RING>;
    int device = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) !=
            cudaSuccess ||
        cudaFuncSetAttribute(kernel,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads,
                                                      smem) != cudaSuccess) {
      return int64_t{0};
    }
    return static_cast<int64_t>(sms) * per_sm;
  }();
  return blocks;
}

// Pre-split x from this many N-tiles of 8 tokens (T > 16) when the
// fragments fit `x_frags`; fewer tokens keep the in-block staging (the
// decode path: one launch, and x is small).
constexpr int kPresplitMinNT = 4;

template <int NT, int SPLITS>
absl::Status Launch(const MmaArgs& a, const Workspace& x_frags,
                    cudaStream_t stream) {
  const int64_t steps = CeilDiv(a.p.in, kStepK);
  const size_t frag_bytes =
      static_cast<size_t>(steps) * kStepFragments<NT, SPLITS> * sizeof(uint4);
  const bool presplit = NT >= kPresplitMinNT && frag_bytes <= x_frags.bytes;
  const size_t tile_bytes = sizeof(uint4) * kRing * kStepFragments<NT, SPLITS>;
  const dim3 block(kThreads);
  if (!presplit) {
    const int64_t resident =
        ResidentBlocks<NT, SPLITS, false, kRing>(tile_bytes);
    if (resident <= 0)
      return absl::InternalError("matmul: no occupancy for the kernel");
    MmaArgs owned = a;
    owned.owner_sums = resident >= a.parts;
    const dim3 grid(static_cast<unsigned>(std::min(a.parts, resident)));
    LaunchPdl(MmaMatmulKernel<NT, SPLITS, false, kRing>, grid, block,
              tile_bytes, stream, owned, static_cast<const uint4*>(nullptr));
    return LaunchStatus("matmul (tensor core) launch");
  }
  if constexpr (NT >= kPresplitMinNT) {
    uint4* xf = static_cast<uint4*>(x_frags.data);
    LaunchPdl(SplitXKernel<NT, SPLITS>, dim3(static_cast<unsigned>(steps)),
              block, 0, stream, a.p, a.t0, a.tokens, xf);
    if (absl::Status s = LaunchStatus("matmul x split launch"); !s.ok())
      return s;
    constexpr int kPresplitRing = 2;
    const size_t stage_bytes =
        sizeof(uint4) * kPresplitRing * kStepFragments<NT, SPLITS>;
    const int64_t resident =
        ResidentBlocks<NT, SPLITS, true, kPresplitRing>(2 * stage_bytes);
    if (resident <= 0)
      return absl::InternalError("matmul: no occupancy for the kernel");
    MmaArgs owned = a;
    owned.owner_sums = resident >= a.parts;
    LaunchPdl(MmaMatmulKernel<NT, SPLITS, true, kPresplitRing>,
              dim3(static_cast<unsigned>(std::min(a.parts, resident))), block,
              2 * stage_bytes, stream, owned, static_cast<const uint4*>(xf));
  }
  return LaunchStatus("matmul (tensor core, pre-split x) launch");
}

template <int SPLITS>
absl::Status LaunchSplits(const MmaArgs& a, const Workspace& x_frags,
                          cudaStream_t stream) {
  const int nt = (a.tokens + 7) / 8;
  if (nt <= 1) return Launch<1, SPLITS>(a, x_frags, stream);
  if (nt <= 2) return Launch<2, SPLITS>(a, x_frags, stream);
  if (nt <= 4) return Launch<4, SPLITS>(a, x_frags, stream);
  return Launch<8, SPLITS>(a, x_frags, stream);
}

}  // namespace

bool MmaMatmulApplies(const MatmulParams& p) {
  return p.w_dtype == DType::kBF16 &&
         p.w_layout == WeightLayout::kTensorCoreTiles && p.in % 8 == 0 &&
         reinterpret_cast<uintptr_t>(p.w) % 16 == 0;
}

MmaPlan PlanMmaMatmul(int64_t in, int64_t out) {
  MmaPlan plan;
  plan.tiles = CeilDiv(out, kTileOut);
  plan.tile_steps = CeilDiv(in, kStepK);
  // No more parts than steps, so that no part is empty (piece indices count
  // parts).
  plan.parts = std::min(plan.tiles * plan.tile_steps, int64_t{kPlanBlocks});
  // Pieces of one tile: a part has at least q >= 1 steps (q = steps /
  // parts), so a tile of n steps meets at most ceil(n/q) + 1 parts (and at
  // most n).
  const int64_t q = plan.tiles * plan.tile_steps / plan.parts;
  plan.max_pieces = std::min(plan.tile_steps, CeilDiv(plan.tile_steps, q) + 1);
  return plan;
}

int64_t MmaMatmulCounters() { return 16384; }

absl::Status LaunchMmaMatmul(const MatmulParams& p, int splits,
                             const Workspace& ws, const Workspace& x_frags,
                             int* counters, cudaStream_t stream) {
  if (splits != 2 && splits != 3) {
    return absl::InvalidArgumentError("matmul: splits must be 2 or 3");
  }
  if (p.norm_weight != nullptr && p.rows > kMaxFusedNormRows) {
    return absl::InternalError(
        "matmul: a fused norm takes at most 8 rows here");
  }
  const MmaPlan plan = PlanMmaMatmul(p.in, p.out);
  if (plan.tiles * plan.tile_steps > (int64_t{1} << 40) / plan.parts) {
    return absl::InvalidArgumentError("matmul: shape too large");
  }
  int64_t per_launch = kMaxTokens;
  if (plan.max_pieces > 1) {
    if (plan.tiles > MmaMatmulCounters()) {
      return absl::InternalError(
          "matmul: too many split tiles for the counters");
    }
    const int64_t fit = static_cast<int64_t>(
        ws.bytes / (sizeof(float) * plan.max_pieces * p.out));
    if (fit < 1)
      return absl::ResourceExhaustedError("matmul: workspace too small");
    per_launch = std::min(per_launch, fit);
  }
  for (int64_t t0 = 0; t0 < p.rows; t0 += per_launch) {
    MmaArgs a;
    a.p = p;
    a.t0 = t0;
    a.tokens = static_cast<int>(std::min(per_launch, p.rows - t0));
    a.tiles = plan.tiles;
    a.tile_steps = plan.tile_steps;
    a.parts = plan.parts;
    a.partial = static_cast<float*>(ws.data);
    a.counters = counters;
    absl::Status s = splits == 3 ? LaunchSplits<3>(a, x_frags, stream)
                                 : LaunchSplits<2>(a, x_frags, stream);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace specserve::kernels::cuda
