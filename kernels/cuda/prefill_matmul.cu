// The prefill matmul (ops.h LaunchPrefillMatmul): y[T][out] (+)= x'·Wᵀ with
// x' = x after its fused RmsNorm or SwiGLU, rounded to one bf16 term, on
// the tensor cores (wgmma, sm_90a) with fp32 accumulation.
//
// Two kernels on the stream:
//  1. PrepXKernel writes x' as bf16 into the scratch, already in the order
//     in which the GEMM's wgmma reads its B operand (below), rows padded
//     with zeros to whole token tiles and k to whole 64-k steps. The norm
//     takes 1/rms from the RmsNorm op's own helpers (rms_inv.cuh: a warp per
//     row below kRmsBlockDim, the block's fixed-order sum from it on) and
//     the SwiGLU the Swiglu op's formula (SwigluElem), so x' is that op's
//     fp32 output rounded to nearest-even bf16, bit for bit.
//  2. PrefillGemmKernel multiplies: bf16 × bf16 products, exact in fp32,
//     summed by wgmma.m64nNk16 into fp32 registers, then stored or added
//     into y (__fadd_rn, y's old value + the sum).
//
// Tiling. A unit of work is one tile of the weight layout (128 outputs,
// tiled_weight.cuh) × BN tokens (BN = 8 .. 256, a power of two chosen per
// call from T and the tile count, see ChooseTokenTile). A block is two
// consumer warpgroups and a producer warpgroup, whose registers mostly go
// to the consumers (setmaxnreg). Per 64-k step one producer thread copies,
// with two bulk copies (cp.async.bulk, completing on the stage's
// mbarrier), the tile's 16 KB weight step (contiguous in the layout) and
// the BN tokens' 64 k of x' (BN·128 contiguous bytes of the scratch) into
// one of kStages shared-memory stages (192 KB in all), running ahead of the
// consumers across units. Consumer warp w (0..7) loads its 16 rows of the
// weight step from shared memory into the registers of wgmma's A operand
// (the layout's 4 chunks per lane are exactly the mma A fragments of rows
// g, g+8 for 16 k), and its warpgroup issues four wgmma.m64nBNk16 with B =
// x' from shared memory, then waits for them before it loads the next
// step's weights (ptxas serialises every wgmma when A registers are
// written while one is in flight); the other warpgroup's wgmmas keep the
// tensor cores busy meanwhile. At BN = 256 each block step is 4.2 MFLOP
// for 48 KB copied into shared memory (128 × 256 × 64 × 2 / (16 KB + 32
// KB)), the reuse CUTLASS's 128 × 256 Hopper tiles have; each warpgroup
// holds 64 × 256 fp32 accumulators (128 registers a thread). The grid is
// persistent (one block per SM, blocks stride over the units), and units
// are ordered in groups of kGroupTiles weight tiles × all token tiles so
// that the blocks running together share weight tiles and x' tiles in L2.
// With `accumulate`, the producer warp prefetches each unit's tile of y
// into L2 a few steps before its epilogue, which loads it in batches: the
// tensor cores idle during an epilogue, and y's loads from DRAM one by one
// cost a quarter of o_proj's time on the H200.
//
// The K permutation. The weight layout gives lane (g, q) of a warp k =
// 16q .. 16q+15 of its rows, and the A fragment of instruction j (0..3)
// takes k = 16q + 4j + {0, 1} as mma k-slots {2q, 2q+1} and 16q + 4j + {2,
// 3} as slots {2q+8, 2q+9} (as in matmul_mma.cu). x' is stored with the
// same permutation: in step s, instruction j's B operand is 16 slots ×
// the tokens as no-swizzle core matrices (8 tokens × 8 slots, 128 bytes),
// slot 2q+e of core half 0 holding k = 16q + 4j + e and of half 1 k = 16q
// + 4j + 2 + e. In the scratch, core (token group G of 8, j, half h) of
// step s lies at byte ((s · T_pad/8 + G) · 4 + j) · 256 + h · 128, so the
// BN tokens of a unit are one contiguous run per step, and in shared memory
// K-adjacent cores are 128 bytes apart and token-adjacent ones 1024.
//
// Row invariance and determinism (kernels/backend.h). Output y[t][o] is
// the k16 slices of its row o and token t in k-step order, each slice
// summed by one wgmma into the same accumulator from +0, then one fp32
// add into y when accumulating. Nothing of that order depends on T, on
// BN, or on where token t falls in its tile: a token's x' column depends
// only on its own x row, every column of a wgmma runs the same arithmetic
// whatever N is (mma_order_probe.cu found N = 8 and 64 both equal to
// mma.sync), no k is ever split between blocks, and no atomics are used.
// Padding rows (past T) and padding k (past in) are zeros in x' and the
// weights, and padding rows' outputs are never stored.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/mma_instructions.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/rms_inv.cuh"
#include "kernels/cuda/tiled_weight.cuh"

namespace specserve::kernels::cuda {
namespace {

constexpr int kConsumerWarps = kTiledWarps;  // warp w reads layout warp w
// Two consumer warpgroups and a producer warpgroup (one thread of it
// issues the copies; a whole warpgroup, so that registers can move to the
// consumers with setmaxnreg).
constexpr int kThreads = (kConsumerWarps + 4) * 32;
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;  // 128·40 + 256·232 <= 64 K registers
constexpr int kWStepBytes = kTiledStepChunks * 16;  // one tile step, 16 KB
constexpr int kXCoreBytes = 128;  // 8 tokens × 8 bf16 k-slots
// Bytes of one token's 64-k step in the scratch and in a stage.
constexpr int kXStepBytesPerToken = kTiledStepK * 2;
constexpr int kStageBudget = 192 * 1024;  // shared memory for the stages
constexpr int kMaxStages = 8;
constexpr int64_t kGroupTiles = 16;  // weight tiles per group of units
constexpr int kPrepThreads = kRmsBlockThreads;
constexpr int kPrepTokens = 8;  // tokens per prep block (one core's rows)
static_assert(kTiledStepK == 64 && kTiledRows == 128,
              "the K permutation below assumes 64-k steps of 128 rows");

template <int BN>
constexpr int kXStageBytes = BN* kXStepBytesPerToken;
template <int BN>
constexpr int kStageBytes = kWStepBytes + kXStageBytes<BN>;
template <int BN>
constexpr int kStages = std::min(kMaxStages, kStageBudget / kStageBytes<BN>);

// ---- PTX wrappers: mbarriers, bulk copies, wgmma groups.

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void MbarInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SmemAddr(bar)),
               "r"(count)
               : "memory");
}

// Makes the initialised barriers visible to the async proxy (bulk copies).
__device__ __forceinline__ void FenceBarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void MbarArriveExpectTx(uint64_t* bar,
                                                   uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                   SmemAddr(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void MbarArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(SmemAddr(bar))
               : "memory");
}

// Returns once the barrier's phase of parity `parity` has completed.
__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = SmemAddr(bar);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } while (done == 0);
}

// `bytes` (a multiple of 16) from global to shared memory, counted on `bar`.
__device__ __forceinline__ void BulkCopy(void* smem_dst, const void* src,
                                         uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
      "[%0], [%1], %2, [%3];\n" ::"r"(SmemAddr(smem_dst)),
      "l"(src), "r"(bytes), "r"(SmemAddr(bar))
      : "memory");
}

template <int N>
__device__ __forceinline__ void SetMaxRegsDec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void SetMaxRegsInc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// The compiler sees the accumulators read and rewritten here: nothing
// reads them before the wgmma wait that precedes this.
template <int NT>
__device__ __forceinline__ void KeepAcc(float (&d)[NT][4]) {
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    asm volatile(""
                 : "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]),
                   "+f"(d[n][3])::"memory");
  }
}

// D[64][N] += A·B over one k16 slice: A from registers in mma.sync's A
// layout (per warp its 16 rows), B (N tokens × 16 k-slots, K-major) from
// shared memory at `desc`; D per warp in mma.sync's C layout, d[n][0..3] =
// (row g, tokens 8n+2q, 8n+2q+1), (row g+8, the same tokens).
template <int N>
struct WgmmaRs;

template <>
struct WgmmaRs<8> {
  static __device__ __forceinline__ void Run(float (&d)[1][4], uint32_t a0,
                                             uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint64_t desc) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, 1, 1, 1, 0;\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
  }
};

template <>
struct WgmmaRs<16> {
  static __device__ __forceinline__ void Run(float (&d)[2][4], uint32_t a0,
                                             uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint64_t desc) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, 1, 1, 1, 0;\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
  }
};

template <>
struct WgmmaRs<32> {
  static __device__ __forceinline__ void Run(float (&d)[4][4], uint32_t a0,
                                             uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint64_t desc) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
        "{%16,%17,%18,%19}, %20, 1, 1, 1, 0;\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
  }
};

template <>
struct WgmmaRs<64> {
  static __device__ __forceinline__ void Run(float (&d)[8][4], uint32_t a0,
                                             uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint64_t desc) {
    Wgmma64(d, a0, a1, a2, a3, desc);
  }
};

template <>
struct WgmmaRs<128> {
  static __device__ __forceinline__ void Run(float (&d)[16][4], uint32_t a0,
                                             uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint64_t desc) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%"
        "19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%"
        "36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%"
        "53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, "
        "1, 1, 1, 0;\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
          "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
          "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
          "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
          "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
  }
};

template <>
struct WgmmaRs<256> {
  static __device__ __forceinline__ void Run(float (&d)[32][4], uint32_t a0,
                                             uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint64_t desc) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%"
        "19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%"
        "36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%"
        "53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%"
        "70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%"
        "87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%"
        "103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%"
        "117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, "
        "{%128,%129,%130,%131}, %132, 1, 1, 1, 0;\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
          "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
          "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
          "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
          "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]),
          "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]),
          "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]),
          "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]),
          "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]),
          "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]),
          "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]),
          "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]),
          "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]),
          "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]),
          "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]),
          "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]),
          "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]),
          "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]),
          "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]),
          "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]),
          "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
  }
};

// ---- Stage 1: x' in the GEMM's B order.

__device__ __forceinline__ void Load4(const float* src, bool vec,
                                      float (&v)[4]) {
  if (vec) {
    const float4 f = *reinterpret_cast<const float4*>(src);
    v[0] = f.x;
    v[1] = f.y;
    v[2] = f.z;
    v[3] = f.w;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = src[e];
  }
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Block (g, c) writes token group g (tokens 8g .. 8g+7, zeros past T) of
// steps [c·steps_per_block, ...): thread item (step s, token, instruction
// j) reads the token's k = 64s + 16q + 4j + 0..3 (q = 0..3) and writes the
// two 16-byte core rows of instruction j (slots 2q, 2q+1 ← e = 0, 1 and
// 2q+8, 2q+9 ← e = 2, 3). A warp writes one step's 1 KB of the group in a
// row. With the norm, a block takes every step of its group (the rows'
// 1/rms once); otherwise blocks take kPrepSteps steps each, so that the
// grid has enough blocks to keep the loads in flight.
constexpr int64_t kPrepSteps = 16;  // two items a thread
__global__ void __launch_bounds__(kPrepThreads)
    PrepXKernel(MatmulParams p, int64_t t_pad, int64_t steps,
                int64_t steps_per_block, uint4* xs) {
  __shared__ double sm_part[kPrepTokens][kRmsBlockThreads / 32];
  __shared__ float sm_inv[kPrepTokens];
  const int64_t group = blockIdx.x;
  const int64_t t0 = group * kPrepTokens;
  const int rows =
      static_cast<int>(max(int64_t{0}, min(int64_t{kPrepTokens}, p.rows - t0)));
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float* xb = p.x + min(t0, p.rows - 1) * p.x_stride;
  const bool norm = p.norm_weight != nullptr;
  if (norm && rows > 0) {
    // The RmsNorm op's choice of variant (rms_norm.cu), by dim only.
    if (p.in >= kRmsBlockDim) {
      BlockInvRmsRows<kPrepTokens>(xb, p.x_stride, rows, p.in, p.norm_eps,
                                   sm_part, sm_inv);
    } else {
      static_assert(kPrepThreads / 32 >= kPrepTokens, "a warp per token");
      if (warp < rows) {
        const float inv =
            WarpInvRms(xb + warp * p.x_stride, p.in, p.norm_eps, lane);
        if (lane == 0) sm_inv[warp] = inv;
      }
      __syncthreads();
    }
  }
  const bool x_vec = reinterpret_cast<uintptr_t>(p.x) % 16 == 0 &&
                     p.x_stride % 4 == 0;  // (in % 8 == 0: the up half too)
  const bool w_vec =
      norm && reinterpret_cast<uintptr_t>(p.norm_weight) % 16 == 0;
  const int64_t groups = t_pad / kPrepTokens;
  const int64_t s0 = blockIdx.y * steps_per_block;
  const int64_t items = (min(steps, s0 + steps_per_block) - s0) * 32;
  // The packed core rows of one item.
  auto values = [&](int64_t item, uint32_t(&lo)[4], uint32_t(&hi)[4]) {
    const int64_t s = s0 + (item >> 5);
    const int tok = static_cast<int>(item >> 2) & 7;
    const int j = static_cast<int>(item) & 3;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int64_t k = s * kTiledStepK + 16 * q + 4 * j;
      float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (tok < rows && k < p.in) {  // (in % 4 == 0: all four or none)
        const float* src = xb + tok * p.x_stride + k;
        Load4(src, x_vec, v);
        if (p.swiglu) {
          float up[4];
          Load4(src + p.in, x_vec, up);
#pragma unroll
          for (int e = 0; e < 4; ++e) v[e] = SwigluElem(v[e], up[e]);
        } else if (norm) {
          float w[4];
          Load4(p.norm_weight + k, w_vec, w);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            v[e] = NormedElemOf(v[e], sm_inv[tok], w[e], p.norm_plus_one);
          }
        }
      }
      lo[q] = PackBf16(v[0], v[1]);
      hi[q] = PackBf16(v[2], v[3]);
    }
  };
  auto store = [&](int64_t item, const uint32_t(&lo)[4],
                   const uint32_t(&hi)[4]) {
    const int64_t s = s0 + (item >> 5);
    const int tok = static_cast<int>(item >> 2) & 7;
    const int j = static_cast<int>(item) & 3;
    uint4* dst =
        xs + ((s * groups + group) * 4 + j) * (2 * kXCoreBytes / 16) + tok;
    dst[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    dst[kXCoreBytes / 16] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
  };
  // Two items per pass, both items' loads before either's stores (x and
  // the scratch may alias as far as the compiler knows).
  for (int64_t i = tid; i < items; i += 2 * kPrepThreads) {
    uint32_t lo0[4], hi0[4], lo1[4], hi1[4];
    const bool two = i + kPrepThreads < items;
    values(i, lo0, hi0);
    if (two) values(i + kPrepThreads, lo1, hi1);
    store(i, lo0, hi0);
    if (two) store(i + kPrepThreads, lo1, hi1);
  }
}

// ---- Stage 2: the GEMM.

struct GemmArgs {
  MatmulParams p;
  const uint8_t* xs;     // the scratch x' (PrepXKernel's layout)
  int64_t x_step_bytes;  // one 64-k step of all T_pad tokens: T_pad · 128
  int64_t tiles;         // weight tiles (128 outputs) covering `out`
  int64_t tblocks;       // token tiles of BN covering T
  int64_t tile_steps;    // 64-k steps per weight tile
  int64_t group_tiles;   // weight tiles per group of units (UnitOf)
};

struct Unit {
  int64_t tile;
  int64_t tblock;
};

// Unit u: groups of kGroupTiles weight tiles (fewer in the last group),
// each group all its tiles for token tile 0, then token tile 1, ...
__device__ __forceinline__ Unit UnitOf(const GemmArgs& a, int64_t u) {
  const int64_t per_group = a.group_tiles * a.tblocks;
  const int64_t first = u / per_group * a.group_tiles;
  const int64_t within = u % per_group;
  const int64_t group_tiles = min(a.group_tiles, a.tiles - first);
  return Unit{first + within % group_tiles, within / group_tiles};
}

template <int BN>
__global__ void __launch_bounds__(kThreads, 1)
    PrefillGemmKernel(const __grid_constant__ GemmArgs a) {
  constexpr int S = kStages<BN>;
  constexpr int NT = BN / 8;
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ __align__(8) uint64_t full[S];  // stage filled (bulk copies)
  __shared__ __align__(8)
      uint64_t empty[S];  // stage read by every consumer warp
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      MbarInit(&full[s], 1);
      MbarInit(&empty[s], kConsumerWarps);
    }
    FenceBarrierInit();
  }
  __syncthreads();
  const int64_t units = a.tiles * a.tblocks;

  if (warp >= kConsumerWarps) {  // the producer warpgroup
    SetMaxRegsDec<kProducerRegs>();
    if (warp != kConsumerWarps) return;
    // Lane 0 issues the copies; with `accumulate`, the whole warp also
    // prefetches a unit's y tile into L2 when it issues the unit's last
    // step, kStages steps before the consumers reach its epilogue, whose
    // loads then hit L2.
    const MatmulParams& p = a.p;
    const uint8_t* w = static_cast<const uint8_t*>(p.w);
    uint32_t it = 0;
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
      const Unit un = UnitOf(a, u);
      const uint8_t* wsrc = w + un.tile * a.tile_steps * kWStepBytes;
      const uint8_t* xsrc = a.xs + un.tblock * kXStageBytes<BN>;
      for (int64_t s = 0; s < a.tile_steps; ++s, ++it) {
        if (lane == 0) {
          const uint32_t stage = it % S;
          if (it >= S) MbarWait(&empty[stage], (it / S - 1) & 1);
          uint8_t* dst = smem + stage * kStageBytes<BN>;
          MbarArriveExpectTx(&full[stage], kStageBytes<BN>);
          BulkCopy(dst, wsrc + s * kWStepBytes, kWStepBytes, &full[stage]);
          BulkCopy(dst + kWStepBytes, xsrc + s * a.x_step_bytes,
                   kXStageBytes<BN>, &full[stage]);
        }
      }
      __syncwarp();
      if (p.accumulate) {
        // Rows of BN tokens × up to 128 outputs: 32 floats (a 128-byte
        // line's worth) at a time, plus each row's last element.
        const int64_t o0 = un.tile * kTiledRows;
        const int64_t olen = min(int64_t{kTiledRows}, p.out - o0);
        const int64_t t0 = un.tblock * BN;
        const int64_t rows = min(int64_t{BN}, p.rows - t0);
        const int per_row = static_cast<int>((olen + 31) / 32) + 1;
        for (int64_t i = lane; i < rows * per_row; i += 32) {
          const int64_t r = i / per_row, c = i % per_row;
          const int64_t o = c < per_row - 1 ? c * 32 : olen - 1;
          PrefetchL2(p.y + (t0 + r) * p.y_stride + o0 + o);
        }
      }
    }
    return;
  }

  // Consumers. Warp w's A fragments: chunks [w][slot][lane] of the step.
  SetMaxRegsInc<kConsumerRegs>();
  const int g = lane >> 2, q = lane & 3;
  const MatmulParams& p = a.p;
  float acc[NT][4];
  uint32_t it = 0;
  for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
    const Unit un = UnitOf(a, u);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[n][i] = 0.0f;
    }
    for (int64_t s = 0; s < a.tile_steps; ++s, ++it) {
      const uint32_t stage = it % S;
      MbarWait(&full[stage], (it / S) & 1);
      const uint8_t* st = smem + stage * kStageBytes<BN>;
      const uint4* wsm = reinterpret_cast<const uint4*>(st) + warp * 128 + lane;
      uint4 wr[4];  // slots: row g k 0..7, 8..15; row g+8 k 0..7, 8..15
#pragma unroll
      for (int slot = 0; slot < 4; ++slot) wr[slot] = wsm[slot * 32];
      const uint8_t* xsm = st + kWStepBytes;
      WgmmaFence();
      // Instruction j: slots 2q.. of rows g / g+8 from chunk j/2 (halves
      // .x.y or .z.w), B = instruction j's 16 slots of every token.
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint4& r0 = wr[j >> 1];
        const uint4& r1 = wr[2 + (j >> 1)];
        const uint64_t desc = WgmmaNoSwizzleDesc(xsm + j * 2 * kXCoreBytes,
                                                 kXCoreBytes, 8 * kXCoreBytes);
        if (j % 2 == 0) {
          WgmmaRs<BN>::Run(acc, r0.x, r1.x, r0.y, r1.y, desc);
        } else {
          WgmmaRs<BN>::Run(acc, r0.z, r1.z, r0.w, r1.w, desc);
        }
      }
      WgmmaCommit();
      // The whole step before the next one's weights are loaded: ptxas
      // serialises every wgmma when registers that a wgmma reads are
      // written while one is in flight (C7513); the other warpgroup's
      // wgmmas keep the tensor cores busy meanwhile.
      WgmmaWait<0>();
      KeepAcc(acc);
      if (lane == 0) MbarArrive(&empty[stage]);
    }

    // acc[n][i]: output o = tile·128 + 16w + g + 8·(i/2), token t = tblock·BN
    // + 8n + 2q + i%2. With `accumulate`, y's old values are loaded kBatch
    // N-tiles at a time, unconditionally (from y[0] where out of range) so
    // that a batch's loads are all in flight together.
    // Offsets within the unit's corner of y are 32-bit (y_stride < 2^23:
    // LaunchPrefillMatmul), which keeps 128 addresses out of the registers.
    const int64_t t_base = un.tblock * BN;
    float* const yu = p.y + t_base * p.y_stride + un.tile * kTiledRows;
    const int ys = static_cast<int>(p.y_stride);
    const int o_left = static_cast<int>(
        min(int64_t{kTiledRows}, p.out - un.tile * kTiledRows));
    const int t_left = static_cast<int>(min(int64_t{BN}, p.rows - t_base));
    const int ow = warp * 16 + g, tq = 2 * q;
    auto in_range = [&](int n, int i) {
      return ow + (i >> 1) * 8 < o_left && tq + 8 * n + (i & 1) < t_left;
    };
    auto y_at = [&](int n, int i) {
      return yu + (tq + 8 * n + (i & 1)) * ys + ow + (i >> 1) * 8;
    };
    if (p.accumulate) {
      // (4 N-tiles a batch: more old values beside the 128 accumulators of
      // BN = 256 spill)
      constexpr int kBatch = NT < 4 ? NT : 4;
#pragma unroll
      for (int n0 = 0; n0 < NT; n0 += kBatch) {
        float old[kBatch][4];
#pragma unroll
        for (int n = 0; n < kBatch; ++n) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            old[n][i] = __ldcg(in_range(n0 + n, i) ? y_at(n0 + n, i) : p.y);
          }
        }
#pragma unroll
        for (int n = 0; n < kBatch; ++n) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            acc[n0 + n][i] = __fadd_rn(old[n][i], acc[n0 + n][i]);
          }
        }
      }
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (in_range(n, i)) *y_at(n, i) = acc[n][i];
      }
    }
  }
}

// ---- Host side.

int SmCount() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) !=
          cudaSuccess ||
      sms < 1) {
    cudaGetLastError();
    return 132;  // (the H200's; only the choice of BN depends on it)
  }
  return sms;
}

// BN for T rows and `tiles` weight tiles: the fewest rounds of units over
// the SMs, a unit costing about BN + 160 (the 160: what a step costs
// whatever BN is, its weight copy and pipeline latency; on the H200 a BN =
// 128 step took 0.6 of a BN = 256 one). Only speed depends on it.
int ChooseTokenTile(int64_t rows, int64_t tiles) {
  const int64_t sms = SmCount();
  int best = 8;
  double best_cost = std::numeric_limits<double>::infinity();
  for (int bn = 8; bn <= 256; bn *= 2) {
    if (bn > 8 && bn / 2 >= rows) break;  // only more padding from here
    const int64_t rounds = CeilDiv(tiles * CeilDiv(rows, bn), sms);
    const double cost = static_cast<double>(rounds) * (bn + 160);
    if (cost < best_cost) best = bn, best_cost = cost;
  }
  return best;
}

struct Plan {
  int bn = 0;
  int64_t t_pad = 0;  // T rounded up to whole token tiles
  int64_t steps = 0;  // 64-k steps (TiledSteps(in))
  int64_t tiles = 0;
};

Plan PlanOf(const MatmulParams& p) {
  Plan plan;
  plan.tiles = CeilDiv(p.out, kTiledRows);
  plan.bn = ChooseTokenTile(p.rows, plan.tiles);
  plan.t_pad = CeilDiv(p.rows, plan.bn) * plan.bn;
  plan.steps = TiledSteps(p.in);
  return plan;
}

template <int BN>
absl::Status LaunchGemm(const MatmulParams& p, const Plan& plan, const void* xs,
                        cudaStream_t stream) {
  constexpr size_t kSmem = static_cast<size_t>(kStages<BN>) * kStageBytes<BN>;
  SS_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(PrefillGemmKernel<BN>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(kSmem)),
      "prefill matmul smem attribute");
  GemmArgs a;
  a.p = p;
  a.xs = static_cast<const uint8_t*>(xs);
  a.x_step_bytes = plan.t_pad * kXStepBytesPerToken;
  a.tiles = plan.tiles;
  a.tblocks = plan.t_pad / BN;
  a.tile_steps = plan.steps;
  a.group_tiles = kGroupTiles;
  const int64_t units = a.tiles * a.tblocks;
  const int64_t grid = std::min<int64_t>(units, SmCount());
  PrefillGemmKernel<BN>
      <<<static_cast<unsigned>(grid), kThreads, kSmem, stream>>>(a);
  return LaunchStatus("prefill matmul launch");
}

}  // namespace

bool PrefillMatmulApplies(const MatmulParams& p) {
  return Validate(p).ok() && p.w_dtype == DType::kBF16 &&
         p.w_layout == WeightLayout::kTensorCoreTiles && p.in % 8 == 0 &&
         reinterpret_cast<uintptr_t>(p.w) % 16 == 0;
}

size_t PrefillMatmulScratchBytes(const MatmulParams& p) {
  if (p.rows < 1 || p.in < 1 || p.out < 1) return 0;
  const Plan plan = PlanOf(p);
  return static_cast<size_t>(plan.t_pad * plan.steps) * kXStepBytesPerToken;
}

absl::Status LaunchPrefillMatmul(const MatmulParams& p, const Workspace& x_bf16,
                                 cudaStream_t stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (!PrefillMatmulApplies(p)) {
    return absl::UnimplementedError(
        "prefill matmul: needs bf16 weights in the tensor-core tile layout "
        "with in % 8 == 0");
  }
  const Plan plan = PlanOf(p);
  if (plan.t_pad / kPrepTokens > 0x7fffffff ||
      plan.tiles > (int64_t{1} << 40) || plan.steps > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError("prefill matmul: shape too large");
  }
  if (p.y_stride >= (int64_t{1} << 23)) {
    return absl::InvalidArgumentError("prefill matmul: y_stride >= 2^23");
  }
  if (x_bf16.data == nullptr || x_bf16.bytes < PrefillMatmulScratchBytes(p) ||
      reinterpret_cast<uintptr_t>(x_bf16.data) % 16 != 0) {
    return absl::InvalidArgumentError(
        "prefill matmul: x scratch smaller than PrefillMatmulScratchBytes or "
        "misaligned");
  }
  const int64_t steps_per_block =
      p.norm_weight != nullptr ? plan.steps : kPrepSteps;
  const dim3 prep_grid(
      static_cast<unsigned>(plan.t_pad / kPrepTokens),
      static_cast<unsigned>(CeilDiv(plan.steps, steps_per_block)));
  PrepXKernel<<<prep_grid, kPrepThreads, 0, stream>>>(
      p, plan.t_pad, plan.steps, steps_per_block,
      static_cast<uint4*>(x_bf16.data));
  if (absl::Status s = LaunchStatus("prefill matmul x prep launch"); !s.ok())
    return s;
  switch (plan.bn) {
    case 8:
      return LaunchGemm<8>(p, plan, x_bf16.data, stream);
    case 16:
      return LaunchGemm<16>(p, plan, x_bf16.data, stream);
    case 32:
      return LaunchGemm<32>(p, plan, x_bf16.data, stream);
    case 64:
      return LaunchGemm<64>(p, plan, x_bf16.data, stream);
    case 128:
      return LaunchGemm<128>(p, plan, x_bf16.data, stream);
    case 256:
      return LaunchGemm<256>(p, plan, x_bf16.data, stream);
    default:
      return absl::InternalError("prefill matmul: unsupported token tile");
  }
}

}  // namespace specserve::kernels::cuda
