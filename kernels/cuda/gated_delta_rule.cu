// Gated delta rule, per-token recurrent form (kernels/gated_delta_rule.h).
//
// The state columns j of one value head are independent: u_j = Σ_i S[i][j]k̂_i
// and o_j = Σ_i S'[i][j]q̂_i only mix entries of column j. A block owns 32·V
// columns of one head (blockIdx = (column tile, head); lane l owns columns
// V·l .. V·l+V-1 of the tile) and W warps; warp w owns rows [R·w, R·w+R) of
// those columns and keeps that slice of S in registers (R·V floats per
// thread) across all T tokens. All state loads are issued up front, so they
// are in flight together, and each token's q/k/v/a/b are prefetched one
// token ahead. dk = dv = 128 (the hot case): R = 16, W = 8, V = 2 (float2
// state accesses, 64 columns per block, 96 blocks for 48 heads); otherwise
// R = 32, W = ceil(dk/32), V = 1.
//
// Per token, every warp L2-normalizes the whole q and k itself (each lane
// sums the squares of elements lane, lane+32, ... in that order, then a xor
// butterfly): the same code in every warp gives the same bits, so no block
// barrier is needed before the decay/u step. Each lane writes q̂, k̂ of those
// of its elements that are rows of its warp into a per-warp shared buffer
// that the warp reads back as broadcasts. Per column, the R row terms of u
// and o of a thread go to 4 accumulators (row r into r%4), added as
// (a0+a1)+(a2+a3); the W warp partials (shared memory, one barrier each for
// u and o) are added as a fixed pairwise tree, ((p0+p1)+(p2+p3)) +
// ((p4+p5)+(p6+p7)) for W = 8. The configuration, hence every order, is
// fixed by (dk, dv) alone; the memory access width (float2, or scalar when
// a state pointer or the snapshot stride is not 8-byte aligned) never
// changes the arithmetic; every operation is an explicit rounded fp32 op
// (no contraction). So each token runs the same instructions whatever T,
// whichever snapshot mode, one-row call or session batch: verify column t
// == decode at that position bit for bit. Rows past dk and columns past dv
// are zeros in S (q̂, k̂ too) and are never loaded or stored. A session batch
// (p.states) gives each row its own blocks (blockIdx.z = row), which run
// the one-row call's instructions on that row's state, in place.
//
// State storage (ST: float, or __nv_bfloat16 for a bf16 state): the state
// is widened on load, and after each token's o has been accumulated from
// its fp32 update, every register of S is rounded to ST (RoundState) before
// the next token, so a verify column and a decode step start from the same
// value and run the same instructions. fp32: the rounding is the identity.
//
// Fused gated norm (GatedDeltaRuleNormed; used for one token of one session
// of the hot shape, FusesGatedDeltaRuleNorm says why): the two
// column tiles of a head form a cluster. Per token, warp 0 of each writes
// its 64 outputs into both blocks' copy of the head's 128 (distributed
// shared memory, one buffer per token parity); after a cluster barrier each
// runs GatedRmsNorm's own code on the whole head (WarpInvRms, the same
// element formula) and writes its 64 normed outputs. So the result is the
// rule followed by GatedRmsNorm, bit for bit, without the second launch. A
// block reads only its own shared memory; the peer writes a buffer again
// only after the next barrier, which the reader passes after its reads, and
// writes it first only after a cluster barrier at the start (the peer has
// started: compute-sanitizer racecheck flags the write otherwise).
//
// Fused conv (GatedDeltaRuleNormParams.conv; kernel 4, nv/nk <= 4):
// the short conv that makes q, k and v runs in the same kernel, each
// channel once per block by Conv1dKernel's formula, so its outputs and
// states are Conv1d's bit for bit. A key head's q/k conv state is read by
// all 2 × group blocks of its value heads and updated in place, so those
// blocks form one cluster and the key head's first block writes the state
// only past the norm's cluster barrier. One fused kernel costs less than the
// conv and the rule launched apart. (The graphed step runs it as a session
// batch of one row: see FusesGatedDeltaRuleNorm.)
//
// Launched as a programmatic dependent (common.cuh). Only the fused kernel
// with the conv reads anything before its wait for the previous kernel:
// weights (a_log, dt_bias, the norm's and the conv's), which no kernel of a
// step writes (uploads end before any later kernel starts: copy.cu), and
// it prefetches its states into L2 (a hint that reads no value). Everything
// else is read after the wait. The prefetch is there because the state and
// conv-state loads otherwise wait for HBM, queued behind out_proj's ring
// preload; it is a hint, not a load, because loading the states before the
// wait outright would be safe only by an occupancy argument.
#include <cooperative_groups.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/rms_inv.cuh"
#include "kernels/cuda/row_formulas.cuh"
#include "kernels/cuda/state_elem.cuh"

namespace specserve::kernels::cuda {
namespace {

constexpr int kMaxKeyDim = 256;
constexpr int kAcc =
    4;  // per-thread accumulators of u and o (row r → r % kAcc)

// One token's inputs as one lane needs them: q and k elements lane + 32m
// (m < M; zero past dk), v of the lane's V columns, a and b.
template <int M, int V>
struct TokenIn {
  float q[M];
  float k[M];
  float v[V];
  float a, b;
};

template <int M, int V, bool kAllQk>
__device__ __forceinline__ void LoadToken(const GatedDeltaRuleParams& p,
                                          int64_t t, const float* q,
                                          const float* k, const float* v, int h,
                                          int dk, const bool (&col)[V],
                                          int lane, TokenIn<M, V>& x) {
  const int64_t row = t * p.qkv_stride;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const bool ok = kAllQk || m * 32 + lane < dk;
    x.q[m] = ok ? q[row + m * 32] : 0.0f;
    x.k[m] = ok ? k[row + m * 32] : 0.0f;
  }
#pragma unroll
  for (int c = 0; c < V; ++c) x.v[c] = col[c] ? v[row + c] : 0.0f;
  x.a = p.a[t * p.ab_stride + h];
  x.b = p.b[t * p.ab_stride + h];
}

// The fused conv (kConv): one channel's conv of kernel 4 at token 0, by
// Conv1dKernel's formula (ConvWindowSum, then silu). `win` is the channel's
// window: the state's 3 raw inputs, then this token's; win[1..3] is its
// next state.
struct ConvChannel {
  float win[4];
  float w[4];
};

__device__ __forceinline__ void LoadConvWeights(const Conv1dParams& c,
                                                int64_t ch, ConvChannel& cc) {
#pragma unroll
  for (int j = 0; j < 4; ++j) cc.w[j] = c.weight[ch * 4 + j];
}

// The channel's state: win[0..3).
__device__ __forceinline__ void LoadConvState(const float* state_in, int64_t ch,
                                              ConvChannel& cc) {
#pragma unroll
  for (int j = 0; j < 3; ++j) cc.win[j] = state_in[ch * 3 + j];
}

__device__ __forceinline__ float ConvOf(const ConvChannel& cc) {
  return Silu(ConvWindowSum(cc.w, cc.win, 4));
}

// Writes the channel's next state, win[1..3].
__device__ __forceinline__ void StoreConvState(float* state_out, int64_t ch,
                                               const ConvChannel& cc) {
#pragma unroll
  for (int j = 0; j < 3; ++j) state_out[ch * 3 + j] = cc.win[j + 1];
}

// Σ of the N partials r[Lo·kStride], r[(Lo+1)·kStride], ... as a fixed
// pairwise tree.
template <int Lo, int N, int kStride>
__device__ __forceinline__ float TreeSum(const float* r) {
  if constexpr (N == 1) {
    return r[Lo * kStride];
  } else {
    return __fadd_rn(TreeSum<Lo, N / 2, kStride>(r),
                     TreeSum<Lo + N / 2, N - N / 2, kStride>(r));
  }
}

__device__ __forceinline__ float AccSum(const float (&acc)[kAcc]) {
  return __fadd_rn(__fadd_rn(acc[0], acc[1]), __fadd_rn(acc[2], acc[3]));
}

// The gate z[j, j + V) of output vector r, loaded by the caller early (with
// the token's inputs) so that the norm's end does not wait for it.
template <int V>
__device__ __forceinline__ void LoadGate(const GatedRmsNormParams& n, int64_t r,
                                         int64_t j, float (&zv)[V]) {
  const float* z = GateRow(n, r);
#pragma unroll
  for (int c = 0; c < V; ++c) zv[c] = z[j + c];
}

// The fused gated norm of output vector r (token, head) whose columns
// [j, j + V) this lane holds (every column: the hot shape has no partial
// tile), called by every thread of the cluster's blocks: the head's outputs
// into both of its tiles' blocks' `head` (this token's parity buffer), a
// cluster barrier, then GatedRmsNorm's code (rms_norm.cu) over the whole head.
template <int W, int V, int kCols, int kDv>
__device__ __forceinline__ void NormOutputs(const GatedRmsNormParams& n,
                                            const float (&partials)[W][kCols],
                                            float* head, const float (&zv)[V],
                                            const float (&wv)[V], int64_t r,
                                            int64_t j, int warp, int lane) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  float o[V];
  if (warp == 0) {
    float* peer = cluster.map_shared_rank(head, cluster.block_rank() ^ 1);
#pragma unroll
    for (int c = 0; c < V; ++c) {
      o[c] = TreeSum<0, W, kCols>(&partials[0][V * lane + c]);
      head[j + c] = o[c];
      peer[j + c] = o[c];
    }
  }
  cluster.sync();  // both halves of the head are in `head`
  if (warp == 0) {
    const float inv = WarpInvRms(head, kDv, n.eps, lane);
    float* y = n.y + r * n.y_stride;
#pragma unroll
    for (int c = 0; c < V; ++c) {
      y[j + c] = __fmul_rn(__fmul_rn(wv[c], __fmul_rn(o[c], inv)), Silu(zv[c]));
    }
  }
}

// R rows per warp, W warps (W·R >= dk), V columns per lane; kFull: dk == W·R;
// kDv: dv when known at compile time (0: p.v_head_dim). The explicit minimum
// of 1 block per SM lets ptxas use more registers (120 for the hot case, no
// spills), which runs faster than the default (96 registers), most of all
// for a verify of several tokens.
// kNorm: the fused gated norm `n` (clusters of 2 along x, 2·32·V == kDv).
// kConv (with kNorm, one token: one session, or a session batch of one row,
// whose states come from the tables and update in place): the conv `cv` of
// kernel 4 first, fused: thread i convolves q/k channel i of the key head
// (dk = 128: 256 channels for 256 threads) and, below kCols, the block's v
// column i, into shared memory, from where every warp reads them as it reads
// q, k and v otherwise. Clusters of 2 × group blocks along (x, y) hold all
// the blocks of a key head, so that the norm's cluster barrier also orders
// every block's reads of the key head's q/k conv state before the writes of
// the one block that updates it.
// (kConv: at most 128 registers, so that a matmul block of 8 warps at 128,
// the next kernel, fits beside it on an SM.)
template <typename ST, int R, int W, int V, bool kFull, int kDv,
          bool kNorm = false, bool kConv = false>
__global__ void __launch_bounds__(W * 32, kConv ? 2 : 1)
    GatedDeltaRuleKernel(GatedDeltaRuleParams p, GatedRmsNormParams n,
                         Conv1dParams cv) {
  static_assert(!kConv || kNorm,
                "kConv: the norm's cluster barrier orders the conv state");
  static_assert(R % kAcc == 0 && R <= 32, "R: a multiple of 4, at most 32");
  static_assert(V == 1 || V == 2, "V: 1 or 2");
  constexpr int M = (W * R + 31) / 32;
  constexpr bool kAllQk = kFull && (W * R) % 32 == 0;  // no q/k element past dk
  constexpr int kCols = 32 * V;                        // columns per block
  constexpr bool kAllCols = kDv != 0 && kDv % kCols == 0;
  __shared__ __align__(16) float qk[W][2][R];  // per warp: k̂, q̂ of its rows
  __shared__ __align__(8) float red[2][W][kCols];  // u, o partials per warp
  static_assert(!kNorm || 2 * kCols == kDv,
                "kNorm: a head is the cluster's two tiles");
  // kNorm: the current token's outputs of the whole head, by token parity.
  __shared__ float head_o[2][kNorm ? kDv : 1];
  // kConv: the token's q and k of the key head, then the block's v columns.
  constexpr int kQk = 2 * W * R;  // kConv: q/k channels, one per thread
  static_assert(!kConv || (kQk == W * 32 && kFull && kCols <= W * 32),
                "kConv: one q/k channel per thread");
  __shared__ float conv_out[kConv ? kQk + kCols : 1];
  // kNorm: no block may write its peer's shared memory before the peer has
  // started; this arrival, waited for before the token loop, orders that.
  if constexpr (kNorm)
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
  PdlLetNextLaunch();

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int dk = static_cast<int>(p.k_head_dim);
  const int64_t dv = kDv != 0 ? kDv : p.v_head_dim;
  const int h = static_cast<int>(blockIdx.y);
  const int64_t j =
      static_cast<int64_t>(blockIdx.x) * kCols + V * lane;  // first column
  bool col[V];
#pragma unroll
  for (int c = 0; c < V; ++c) col[c] = kAllCols || j + c < dv;
  const int row0 = warp * R;
  const unsigned group =  // nv <= 65535 (checked by the launcher)
      static_cast<unsigned>(p.num_v_heads) /
      static_cast<unsigned>(p.num_k_heads);
  const int kh = static_cast<int>(static_cast<unsigned>(h) / group);

  // The coefficients and the norm's weights (kNorm, warp 0: of the lane's
  // columns). kConv (one token) reads them before the wait: weights are
  // written only when the model loads, never by a kernel of a step, and the
  // kernel starts while the previous one drains, so these loads leave the
  // chain's critical path. The other instances read them after the wait:
  // before it, the session-batch rule of 64 rows (with the conv and the
  // norm) runs slower.
  float dt_bias, a_log, norm_w[V];
  auto load_weights = [&] {
    dt_bias = p.dt_bias[h];
    a_log = p.a_log[h];
    if (kNorm && warp == 0) {
#pragma unroll
      for (int c = 0; c < V; ++c) norm_w[c] = n.weight[j + c];
    }
  };
  if constexpr (kConv) load_weights();
  // kConv: the conv of thread i's channels (q/k channel qk_ch of the key
  // head; below kCols, v channel v_ch of the block's columns).
  const int64_t qk_ch =
      kConv ? (threadIdx.x < kQk / 2 ? p.q - cv.y : p.k - cv.y) + kh * dk +
                  threadIdx.x % (kQk / 2)
            : 0;
  const bool has_v = kConv && threadIdx.x < kCols;
  const int64_t v_ch = kConv ? (p.v - cv.y) + h * dv +
                                   static_cast<int64_t>(blockIdx.x) * kCols +
                                   threadIdx.x
                             : 0;
  ConvChannel qk_conv, v_conv;
  if constexpr (kConv) {
    LoadConvWeights(cv, qk_ch, qk_conv);
    if (has_v) LoadConvWeights(cv, v_ch, v_conv);
  }
  const bool batch = p.states != nullptr;
  const int64_t t0 = batch ? static_cast<int64_t>(blockIdx.z) : 0;
  const int64_t s_off = h * (dk * dv) + row0 * dv + j;
  // A session batch's row t0 updates its own states in place; their
  // pointers come from the tables (TableEntry: safe before the wait).
  void* const state_row = batch ? TableEntry(p.states, t0) : nullptr;
  float* const conv_row = kConv && batch ? TableEntry(cv.states, t0) : nullptr;
  if constexpr (kConv) {
    // The states may be written by an earlier kernel still in flight, so
    // they are only prefetched into L2 before the wait (PrefetchL2).
    const ST* rs = static_cast<const ST*>(batch ? state_row : p.state_in);
    // Each thread at most one 128-byte line of the block's [R·W rows][kCols]
    // slice (kCols = 64: two lines per row of fp32, one of bf16).
    constexpr int kLinesPerRow = kCols * static_cast<int>(sizeof(ST)) / 128;
    static_assert(kLinesPerRow >= 1, "kConv: whole lines per row");
    const int line = threadIdx.x;
    const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kCols;
    if (line < R * W * kLinesPerRow) {
      PrefetchL2(rs + h * (dk * dv) + (line / kLinesPerRow) * dv + col0 +
                 (line % kLinesPerRow) * (128 / sizeof(ST)));
    }
    const float* cs = batch ? conv_row : cv.state_in;
    // The conv windows: 3 floats per channel, the key head's q/k channels
    // (2·dk) and the block's v channels (kCols), contiguous in each.
    if (threadIdx.x < 2 * dk * 3 / 32) {
      const int64_t qk0 =
          (threadIdx.x < dk * 3 / 32 ? p.q - cv.y : p.k - cv.y) + kh * dk;
      PrefetchL2(cs + qk0 * 3 + (threadIdx.x % (dk * 3 / 32)) * 32);
    } else if (threadIdx.x < 2 * dk * 3 / 32 + kCols * 3 / 32) {
      const int64_t v0 =
          (p.v - cv.y) + h * dv + static_cast<int64_t>(blockIdx.x) * kCols;
      PrefetchL2(cs + v0 * 3 + (threadIdx.x - 2 * dk * 3 / 32) * 32);
    }
  }
  PdlWait();  // every other input may be the previous kernel's output
  const int64_t t1 = batch ? t0 + 1 : p.rows;
  const ST* state_in = static_cast<const ST*>(batch ? state_row : p.state_in);
  ST* state_out = static_cast<ST*>(batch ? state_row : p.state_out);
  // Two-element accesses need 2·sizeof(ST) alignment.
  constexpr uintptr_t kPairAlign = 2 * sizeof(ST) - 1;

  // This thread's columns of the warp's rows, all loads in flight together.
  float S[R][V];
  {
    const ST* src = state_in + s_off;
    if (V == 2 && col[V - 1] &&
        (reinterpret_cast<uintptr_t>(state_in) & kPairAlign) == 0 &&
        dv % 2 == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float2 x = (kFull || row0 + r < dk) ? LoadState2(src + r * dv)
                                                  : make_float2(0.0f, 0.0f);
        S[r][0] = x.x;
        S[r][V - 1] = x.y;
      }
    } else {
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int c = 0; c < V; ++c) {
          S[r][c] = ((kFull || row0 + r < dk) && col[c])
                        ? LoadState(src + r * dv + c)
                        : 0.0f;
        }
      }
    }
  }
  // kConv: the conv state written (a session batch's row: in place).
  float* const conv_state = kConv ? (batch ? conv_row : cv.state_out) : nullptr;
  if constexpr (kConv) {
    const float* conv_state_in = batch ? conv_state : cv.state_in;
    LoadConvState(conv_state_in, qk_ch, qk_conv);
    if (has_v) LoadConvState(conv_state_in, v_ch, v_conv);
  }
  const float* qp = p.q + kh * dk + lane;
  const float* kp = p.k + kh * dk + lane;
  const int64_t v_off = h * dv + j;
  const float* vp = p.v + v_off;
  TokenIn<M, V> cur;
  // kConv: the key head's first block writes the q/k outputs and (after
  // the cluster barrier) their states.
  const bool qk_writer =
      kConv && blockIdx.x == 0 && static_cast<unsigned>(h) % group == 0;
  if constexpr (kConv) {
    const int tid = threadIdx.x;
    qk_conv.win[3] = cv.x[qk_ch];  // (token 0: the fused conv runs one token)
    if (has_v) v_conv.win[3] = cv.x[v_ch];
    cur.a = p.a[h];
    cur.b = p.b[h];
    const float y_qk = ConvOf(qk_conv);
    conv_out[tid] = y_qk;
    if (qk_writer) cv.y[qk_ch] = y_qk;
    if (has_v) {
      // (this thread is the v channel's only reader: its state is written now)
      const float y_v = ConvOf(v_conv);
      conv_out[kQk + tid] = y_v;
      cv.y[v_ch] = y_v;
      StoreConvState(conv_state, v_ch, v_conv);
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < M; ++m) {
      cur.q[m] = conv_out[m * 32 + lane];
      cur.k[m] = conv_out[kQk / 2 + m * 32 + lane];
    }
#pragma unroll
    for (int c = 0; c < V; ++c) cur.v[c] = conv_out[kQk + V * lane + c];
  } else {
    LoadToken<M, V, kAllQk>(p, t0, qp, kp, vp, h, dk, col, lane, cur);
  }
  if constexpr (!kConv) load_weights();
  const float a_coef = -expf(a_log);
  const float q_scale = 1.0f / sqrtf(static_cast<float>(dk));

  float* kn = qk[warp][0];
  float* qn = qk[warp][1];
  ST* dst = state_out + s_off;
  const bool vec_out =
      V == 2 && col[V - 1] &&
      (reinterpret_cast<uintptr_t>(state_out) & kPairAlign) == 0 &&
      p.state_out_stride % 2 == 0 && dv % 2 == 0;
  if constexpr (kNorm)
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
  for (int64_t t = t0; t < t1; ++t) {
    float zv[V];  // kNorm, warp 0: the token's gate
    if (kNorm && warp == 0) LoadGate<V>(n, t * p.num_v_heads + h, j, zv);
    TokenIn<M, V> nxt = {};
    if (t + 1 < t1)
      LoadToken<M, V, kAllQk>(p, t + 1, qp, kp, vp, h, dk, col, lane, nxt);

    // q̂, k̂: whole-vector norms, computed alike by every warp; each lane
    // writes those of its elements that are rows of its warp.
    float sq = 0.0f, sk = 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      sq = fmaf(cur.q[m], cur.q[m], sq);
      sk = fmaf(cur.k[m], cur.k[m], sk);
    }
    sq = WarpSum(sq);
    sk = WarpSum(sk);
    const float inv_q = 1.0f / sqrtf(__fadd_rn(sq, 1e-6f));
    const float inv_k = 1.0f / sqrtf(__fadd_rn(sk, 1e-6f));
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const int i = m * 32 + lane - row0;
      if (i >= 0 && i < R) {
        kn[i] = __fmul_rn(cur.k[m], inv_k);  // (k·inv)·1 == k·inv exactly
        qn[i] = __fmul_rn(__fmul_rn(cur.q[m], inv_q), q_scale);
      }
    }
    const float beta = Sigmoid(cur.b);
    const float decay =
        expf(__fmul_rn(a_coef, Softplus(__fadd_rn(cur.a, dt_bias))));
    __syncwarp();

    // S ← decay·S and this warp's part of u = Sᵀk̂.
    float acc[V][kAcc];
#pragma unroll
    for (int c = 0; c < V; ++c) {
#pragma unroll
      for (int a = 0; a < kAcc; ++a) acc[c][a] = 0.0f;
    }
#pragma unroll
    for (int r4 = 0; r4 < R / 4; ++r4) {
      const float4 kk = reinterpret_cast<const float4*>(kn)[r4];
      const float kv[4] = {kk.x, kk.y, kk.z, kk.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = r4 * 4 + e;
#pragma unroll
        for (int c = 0; c < V; ++c) {
          S[r][c] = __fmul_rn(S[r][c], decay);
          acc[c][r % kAcc] = fmaf(S[r][c], kv[e], acc[c][r % kAcc]);
        }
      }
    }
#pragma unroll
    for (int c = 0; c < V; ++c) red[0][warp][V * lane + c] = AccSum(acc[c]);
    __syncthreads();
    float delta[V];
#pragma unroll
    for (int c = 0; c < V; ++c) {
      const float u = TreeSum<0, W, kCols>(&red[0][0][V * lane + c]);
      delta[c] = __fmul_rn(__fsub_rn(cur.v[c], u), beta);
    }

    // S ← S + k̂·δᵀ and this warp's part of o = Sᵀq̂; snapshot.
#pragma unroll
    for (int c = 0; c < V; ++c) {
#pragma unroll
      for (int a = 0; a < kAcc; ++a) acc[c][a] = 0.0f;
    }
#pragma unroll
    for (int r4 = 0; r4 < R / 4; ++r4) {
      const float4 kk = reinterpret_cast<const float4*>(kn)[r4];
      const float4 qq = reinterpret_cast<const float4*>(qn)[r4];
      const float kv[4] = {kk.x, kk.y, kk.z, kk.w};
      const float qv[4] = {qq.x, qq.y, qq.z, qq.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = r4 * 4 + e;
#pragma unroll
        for (int c = 0; c < V; ++c) {
          S[r][c] = fmaf(kv[e], delta[c], S[r][c]);
          acc[c][r % kAcc] = fmaf(S[r][c], qv[e], acc[c][r % kAcc]);
        }
      }
    }
    // The state the next token reads: the storage type's value.
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int c = 0; c < V; ++c) S[r][c] = RoundState<ST>(S[r][c]);
    }
    if (p.state_out_stride != 0 || t == t1 - 1) {
      if (vec_out) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (kFull || row0 + r < dk) {
            StoreState2(dst + r * dv, S[r][0], S[r][V - 1]);
          }
        }
      } else {
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
          for (int c = 0; c < V; ++c) {
            if ((kFull || row0 + r < dk) && col[c]) {
              StoreState(dst + r * dv + c, S[r][c]);
            }
          }
        }
      }
    }
#pragma unroll
    for (int c = 0; c < V; ++c) red[1][warp][V * lane + c] = AccSum(acc[c]);
    __syncthreads();
    if constexpr (kNorm) {
      NormOutputs<W, V, kCols, kDv>(n, red[1], head_o[t & 1], zv, norm_w,
                                    t * p.num_v_heads + h, j, warp, lane);
      if constexpr (kConv) {
        // Past NormOutputs' cluster barrier every block of the key head has
        // read its q/k conv state: its first block writes it.
        if (qk_writer) StoreConvState(conv_state, qk_ch, qk_conv);
      }
    } else if (warp == 0) {
      float* out = p.out + t * p.out_stride + v_off;
#pragma unroll
      for (int c = 0; c < V; ++c) {
        if (col[c]) out[c] = TreeSum<0, W, kCols>(&red[1][0][V * lane + c]);
      }
    }
    dst += p.state_out_stride;
    cur = nxt;
  }
}

dim3 GridOf(const GatedDeltaRuleParams& p, int cols) {
  return dim3(static_cast<unsigned>(CeilDiv(p.v_head_dim, cols)),
              static_cast<unsigned>(p.num_v_heads),
              p.states != nullptr ? static_cast<unsigned>(p.rows) : 1u);
}

template <typename ST, int R, int W, int V, bool kFull, int kDv>
void Launch(const GatedDeltaRuleParams& p, cudaStream_t stream) {
  LaunchPdl(GatedDeltaRuleKernel<ST, R, W, V, kFull, kDv>, GridOf(p, 32 * V),
            dim3(W * 32), 0, stream, p, GatedRmsNormParams{}, Conv1dParams{});
}

// Rows of 32 per warp, W = ceil(dk/32) warps, a column per lane.
template <typename ST, int W>
void LaunchGeneric(const GatedDeltaRuleParams& p, cudaStream_t stream) {
  if (p.k_head_dim == W * 32) {
    Launch<ST, 32, W, 1, true, 0>(p, stream);
  } else {
    Launch<ST, 32, W, 1, false, 0>(p, stream);
  }
}

// The configuration depends on (dk, dv) only: it fixes every summation
// order, so all calls of one model shape agree bit for bit.
template <typename ST>
void LaunchShape(const GatedDeltaRuleParams& p, cudaStream_t stream) {
  if (p.k_head_dim == 128 && p.v_head_dim == 128) {
    Launch<ST, 16, 8, 2, true, 128>(p, stream);
    return;
  }
  switch (CeilDiv(p.k_head_dim, 32)) {
    case 1:
      return LaunchGeneric<ST, 1>(p, stream);
    case 2:
      return LaunchGeneric<ST, 2>(p, stream);
    case 3:
      return LaunchGeneric<ST, 3>(p, stream);
    case 4:
      return LaunchGeneric<ST, 4>(p, stream);
    case 5:
      return LaunchGeneric<ST, 5>(p, stream);
    case 6:
      return LaunchGeneric<ST, 6>(p, stream);
    case 7:
      return LaunchGeneric<ST, 7>(p, stream);
    default:
      return LaunchGeneric<ST, 8>(p, stream);
  }
}

template <typename ST>
void LaunchFused(const GatedDeltaRuleNormParams& p, bool with_conv,
                 unsigned group, cudaStream_t stream) {
  if (with_conv) {
    LaunchPdlCluster(GatedDeltaRuleKernel<ST, 16, 8, 2, true, 128, true, true>,
                     GridOf(p.rule, 64), dim3(8 * 32), dim3(2, group, 1), 0,
                     stream, p.rule, p.norm, p.conv);
  } else {
    LaunchPdlCluster(GatedDeltaRuleKernel<ST, 16, 8, 2, true, 128, true>,
                     GridOf(p.rule, 64), dim3(8 * 32), dim3(2, 1, 1), 0, stream,
                     p.rule, p.norm, Conv1dParams{});
  }
}

}  // namespace

// The hot shape's configuration (R = 16, W = 8, V = 2: two column tiles of
// 64 per head), as the rule alone runs it; the norm must be GatedRmsNorm in
// place over the rule's output heads (Validate). One token only, of one
// session or of a session batch of one row: the latter is the recorded
// decode step's form at B = 1 (worker/model/decode_step.cc: its cache ops
// take their states from the session table, so the graphed greedy step runs
// the fused kernel too). At one token the saved launch pays a little, while
// over several tokens (verify) and in session batches of several rows the
// cluster barrier and warp 0's norm per token cost more than a launch. Both
// ways give the same bits, so the choice is free.
bool FusesGatedDeltaRuleNorm(const GatedDeltaRuleNormParams& p) {
  return p.rule.k_head_dim == 128 && p.rule.v_head_dim == 128 &&
         p.rule.rows == 1 && p.rule.num_v_heads <= 65535 && Validate(p).ok();
}

absl::Status LaunchGatedDeltaRuleNormed(const GatedDeltaRuleNormParams& p,
                                        cudaStream_t stream) {
  if (!FusesGatedDeltaRuleNorm(p)) {
    return absl::InvalidArgumentError(
        "gated_delta_rule_normed: not the fused shape");
  }
  // The conv joins the fused kernel when it is the model's (kernel 4) and a
  // key head's blocks fit one cluster (2 × group <= 8, the portable size);
  // otherwise it runs first, on its own. (Validate made its rows the rule's.)
  const unsigned group =
      static_cast<unsigned>(p.rule.num_v_heads / p.rule.num_k_heads);
  const bool bf16 = p.rule.state_dtype == DType::kBF16;
  if (p.conv.rows > 0 && p.conv.kernel == 4 && group <= 4) {
    if (bf16) {
      LaunchFused<__nv_bfloat16>(p, true, group, stream);
    } else {
      LaunchFused<float>(p, true, group, stream);
    }
    return LaunchStatus("gated_delta_rule_normed (with conv) launch");
  }
  if (p.conv.rows > 0) {
    if (absl::Status s = LaunchConv1d(p.conv, stream); !s.ok()) return s;
  }
  if (bf16) {
    LaunchFused<__nv_bfloat16>(p, false, group, stream);
  } else {
    LaunchFused<float>(p, false, group, stream);
  }
  return LaunchStatus("gated_delta_rule_normed launch");
}

absl::Status LaunchGatedDeltaRule(const GatedDeltaRuleParams& p,
                                  cudaStream_t stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (p.k_head_dim > kMaxKeyDim) {
    return absl::UnimplementedError(
        "gated_delta_rule: k_head_dim > 256 unsupported");
  }
  if (p.num_v_heads > 65535) {
    return absl::UnimplementedError(
        "gated_delta_rule: more than 65535 value heads");
  }
  if (p.states != nullptr && p.rows > 65535) {
    return absl::UnimplementedError(
        "gated_delta_rule: session batch of more than 65535 rows");
  }
  if (p.state_dtype == DType::kBF16) {
    LaunchShape<__nv_bfloat16>(p, stream);
  } else {
    LaunchShape<float>(p, stream);
  }
  return LaunchStatus("gated_delta_rule launch");
}

}  // namespace specserve::kernels::cuda
