// The gated delta rule for the many tokens of one session's prompt chunk
// (kernels/gated_delta_rule.h, single state slot), in an order that keeps
// the per-token dependency chain short.
//
// Algorithm. The state columns j of a value head are independent: per
// token, u_j = Σ_i S[i][j]·k̂_i, δ_j = β(v_j − u_j), S[i][j] += k̂_i·δ_j and
// o_j = Σ_i S[i][j]·q̂_i mix entries of column j only. So each warp carries
// 32/R columns of one value head through all T tokens, its part of S in
// registers, with no block barrier: a block is only a packing of
// independent warps onto an SM.
//
// Mapping. Warp w of the grid (blockIdx.x·warps_per_block + warp) is value
// head h = w / (dv·R/32) and columns j0 = (w % (dv·R/32))·32/R. Lane l
// owns column j0 + l/R and, as row-lane rl = l % R, the NR = dk/R rows
// [rl·NR, rl·NR + NR) of it: NR registers of S (R = 4 for dk <= 128: 8
// columns and 32 rows per lane at dk = 128; R = 8 above). Per token:
//  - q, k: lane l loads elements l + 32m (coalesced, two tokens ahead);
//    Σq² and Σk² in one xor butterfly (lanes < 16 carry Σq², the others
//    Σk², after the first step; each sum's tree is WarpSum's), one 1/sqrt
//    per lane, exchanged across the halves: the exact kernel's formulas
//    and sums (gated_delta_rule.cu). q̂ and k̂ go to the warp's shared
//    buffer for that token's parity, which each lane reads back as float4s
//    of its own rows; __syncwarp orders the two.
//  - β = sigmoid(b), decay = exp(−exp(A_log)·softplus(a + dt_bias)): lane l
//    computes them for token 32n + l of each group n of 32 tokens, a group
//    ahead; token t takes them from lane t % 32 (a shuffle). common.cuh's
//    formulas, as in the exact kernel.
//  - S ← decay·S and u's partials over the lane's rows (row r into
//    accumulator r % 4, in row order; (a0 + a1) + (a2 + a3)), then a xor
//    butterfly over the R row-lanes: every row-lane gets u_j, so δ_j needs
//    no exchange. S += k̂·δ and o's partials alike; o's butterfly runs in
//    the next token's iteration beside u's, and row-lane 0 writes o_j.
//  The state is read once at the start and written once at the end: in
//  place is safe, as each warp reads and writes only its own slice.
//
// Determinism and chunking. Every operation is an explicit rounded fp32 op
// (__fmul_rn, __fadd_rn, fmaf), so nvcc cannot contract differently between
// instantiations, and every sum's order is fixed by (dk, R), R by (dk, dv)
// alone (RowLanes). A token's arithmetic depends only on its inputs and the
// state before it, never on T, on its position in the call (which lane
// computes its gates changes no value) or on how warps are packed into
// blocks. So the kernel is deterministic, and any split of the tokens into
// calls, the state passing between them in fp32, gives one call's bits. The
// order is not the exact kernel's (u and o are summed differently): the two
// agree within fp32 rounding.
//
// State storage (ST: float or __nv_bfloat16, GatedDeltaRuleParams
// state_dtype): widened on load; each token's o comes from its fp32 update,
// then every register of S is rounded to ST (RoundState) before the next
// token, so the state between tokens is the storage type's value and any
// split of the tokens into calls still gives one call's bits.
//
// The inputs (q, k, v, a, b, A_log, dt_bias) are read through the read-only
// data cache: no output (out, state_out) may overlap them.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/state_elem.cuh"

namespace specserve::kernels::cuda {
namespace {

constexpr int kMaxKeyDim = 256;
constexpr int kMaxValueDim = 256;

// Token t's raw inputs as one lane loads them: q and k elements lane + 32m
// of the key head (coalesced), and v of the lane's own column.
template <int M>
struct TokenIn {
  float q[M];
  float k[M];
  float v;
};

template <int M>
__device__ __forceinline__ TokenIn<M> LoadToken(const float* q, const float* k,
                                                const float* v, int64_t row) {
  TokenIn<M> x;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    x.q[m] = __ldg(q + row + 32 * m);
    x.k[m] = __ldg(k + row + 32 * m);
  }
  x.v = __ldg(v + row);
  return x;
}

// Where row i of q̂ (and, kHatStride floats on, of k̂) lives in a warp's
// buffer: row-lane r's NR rows are contiguous, 4 floats of padding between
// row-lanes so that the R row-lanes' float4 reads fall in distinct banks.
template <int NR>
__device__ __forceinline__ int HatIndex(int i) {
  return i + (i / NR) * 4;
}

// q̂ = q·rsqrt(Σq² + 1e-6)·dk^(−1/2) and k̂ = k·rsqrt(Σk² + 1e-6), the exact
// kernel's formulas (gated_delta_rule.cu) and sums: each lane's squares by
// fmaf in m order from +0, then a xor butterfly whose every step is
// WarpSum's (own + partner), so every lane gets the exact kernel's bits.
// Lanes < 16 carry Σq² from the first step on and lanes >= 16 Σk², so one
// 1/sqrt per lane serves both. Written to `hat` (q̂ at HatIndex, k̂
// kHatStride floats on); the caller syncs the warp before reading it.
template <int M, int NR, int kHatStride>
__device__ __forceinline__ void NormalizeInto(const TokenIn<M>& x,
                                              float q_scale, int lane,
                                              float* hat) {
  float sq = 0.0f, sk = 0.0f;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    sq = fmaf(x.q[m], x.q[m], sq);
    sk = fmaf(x.k[m], x.k[m], sk);
  }
  const bool k_half = (lane & 16) != 0;
  float s = __fadd_rn(k_half ? sk : sq,
                      __shfl_xor_sync(kFullMask, k_half ? sq : sk, 16));
#pragma unroll
  for (int mask = 8; mask > 0; mask >>= 1)
    s = __fadd_rn(s, __shfl_xor_sync(kFullMask, s, mask));
  const float inv = 1.0f / sqrtf(__fadd_rn(s, 1e-6f));
  const float other = __shfl_xor_sync(kFullMask, inv, 16);
  const float inv_q = k_half ? other : inv;
  const float inv_k = k_half ? inv : other;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const int i = HatIndex<NR>(lane + 32 * m);
    hat[i] = __fmul_rn(__fmul_rn(x.q[m], inv_q), q_scale);
    hat[kHatStride + i] = __fmul_rn(x.k[m], inv_k);  // (k·inv)·1 == k·inv
  }
}

// One token's gates, by the exact kernel's formulas.
struct Gates {
  float beta;
  float decay;
};

__device__ __forceinline__ Gates GatesOf(float a, float b, float a_coef,
                                         float dt_bias) {
  return Gates{Sigmoid(b),
               expf(__fmul_rn(a_coef, Softplus(__fadd_rn(a, dt_bias))))};
}

// The raw a and b of token t of head h (zeros past the call's tokens).
struct RawGates {
  float a;
  float b;
};

__device__ __forceinline__ RawGates LoadGates(const GatedDeltaRuleParams& p,
                                              int64_t t, int h) {
  if (t >= p.rows) return RawGates{0.0f, 0.0f};
  const int64_t i = t * p.ab_stride + h;
  return RawGates{__ldg(p.a + i), __ldg(p.b + i)};
}

// Σ over the R row-lanes of a column (lane bits below R) of a lane's four
// accumulators: (a0 + a1) + (a2 + a3), then a xor butterfly with masks
// 1, 2, .. R/2. Every row-lane of the column gets the same bits.
template <int R>
__device__ __forceinline__ float ColumnSum(const float (&acc)[4]) {
  float v = __fadd_rn(__fadd_rn(acc[0], acc[1]), __fadd_rn(acc[2], acc[3]));
#pragma unroll
  for (int mask = 1; mask < R; mask <<= 1)
    v = __fadd_rn(v, __shfl_xor_sync(kFullMask, v, mask));
  return v;
}

constexpr int kMaxWarpsPerBlock = 8;

// Floats of one warp's q̂/k̂ buffers (two token parities, q̂ then k̂).
__host__ __device__ constexpr int HatFloats(int dk, int row_lanes) {
  return 2 * 2 * (dk + 4 * row_lanes);
}

// M = dk/32; R row-lanes per column (a power of two, 32·M/R rows per lane,
// a multiple of 4); 32/R columns per warp, dividing dv (the launcher
// checks). Any number of warps per block (the block only packs them);
// dynamic shared memory: HatFloats per warp.
template <typename ST, int M, int R>
__global__ void __launch_bounds__(kMaxWarpsPerBlock * 32)
    PrefillGatedDeltaRuleKernel(GatedDeltaRuleParams p) {
  constexpr int dk = 32 * M;
  constexpr int NR = dk / R;              // rows per lane
  constexpr int kCols = 32 / R;           // columns per warp
  constexpr int kHatStride = dk + 4 * R;  // floats per q̂ (or k̂) buffer
  static_assert(M >= 1 && M <= kMaxKeyDim / 32, "dk: 32..256");
  static_assert(R >= 1 && R <= 32 && (R & (R - 1)) == 0, "R: a power of 2");
  static_assert(NR % 4 == 0, "rows per lane: a multiple of 4");
  static_assert(HatFloats(dk, R) == 4 * kHatStride, "buffer layout");
  extern __shared__ float4 dyn_smem[];
  const int warps_per_block = static_cast<int>(blockDim.x >> 5);
  float* const hat_base = reinterpret_cast<float*>(dyn_smem) +
                          (threadIdx.x >> 5) * HatFloats(dk, R);
  auto hat_buf = [&](int64_t parity) {
    return hat_base + (parity & 1) * 2 * kHatStride;
  };

  PdlWait();  // every input may be the previous kernel's output
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t warp_id =
      static_cast<int64_t>(blockIdx.x) * warps_per_block + warp;
  const int64_t dv = p.v_head_dim;
  const int64_t groups = dv / kCols;
  if (warp_id >= p.num_v_heads * groups) {  // the whole warp leaves
    PdlLetNextLaunch();
    return;
  }
  const int h = static_cast<int>(warp_id / groups);
  const int kh = static_cast<int>(h / (p.num_v_heads / p.num_k_heads));
  const int rl = lane & (R - 1);  // row-lane: rows [rl·NR, rl·NR + NR)
  const int64_t j = (warp_id % groups) * kCols + lane / R;  // column

  // This lane's rows of column j.
  float S[NR];
  ST* const s_col =
      static_cast<ST*>(p.state_out) + h * (dk * dv) + (rl * NR) * dv + j;
  {
    const ST* src =
        static_cast<const ST*>(p.state_in) + h * (dk * dv) + (rl * NR) * dv + j;
#pragma unroll
    for (int r = 0; r < NR; ++r) S[r] = LoadState(src + r * dv);
  }

  const float a_coef = -expf(__ldg(p.a_log + h));
  const float dt_bias = __ldg(p.dt_bias + h);
  const float q_scale = 1.0f / sqrtf(static_cast<float>(dk));
  const float* qp = p.q + kh * dk + lane;
  const float* kp = p.k + kh * dk + lane;
  const float* vp = p.v + h * dv + j;
  const int64_t rows = p.rows;
  const int64_t qs = p.qkv_stride;
  float* const out = p.out + h * dv + j;
  const bool writer = rl == 0;

  // Gates: lane l holds token 32n + l's of the current group n (gates) and
  // of the next (next_gates); raw holds group n + 2's inputs.
  const RawGates raw0 = LoadGates(p, lane, h);
  const RawGates raw1 = LoadGates(p, 32 + lane, h);
  RawGates raw = LoadGates(p, 64 + lane, h);
  Gates gates = GatesOf(raw0.a, raw0.b, a_coef, dt_bias);
  Gates next_gates = GatesOf(raw1.a, raw1.b, a_coef, dt_bias);

  // Token pipeline: while token t is computed, t + 1 is normalised (into
  // the other parity's buffer), t + 2 loaded, and o of t − 1 summed (o_acc:
  // its partials). Rows past the last are clamped to it (loaded, unused).
  const TokenIn<M> in0 = LoadToken<M>(qp, kp, vp, 0);
  TokenIn<M> in1 = LoadToken<M>(qp, kp, vp, (rows > 1 ? 1 : 0) * qs);
  float v_cur = in0.v;
  NormalizeInto<M, NR, kHatStride>(in0, q_scale, lane, hat_buf(0));
  __syncwarp();
  float o_acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};

  for (int64_t t = 0; t < rows; ++t) {
    const int slot = static_cast<int>(t & 31);
    if (slot == 0 && t > 0) {
      gates = next_gates;
      next_gates = GatesOf(raw.a, raw.b, a_coef, dt_bias);
      raw = LoadGates(p, t + 64 + lane, h);
    }
    const TokenIn<M> in2 = LoadToken<M>(qp, kp, vp, min(t + 2, rows - 1) * qs);
    const float beta = __shfl_sync(kFullMask, gates.beta, slot);
    const float decay = __shfl_sync(kFullMask, gates.decay, slot);
    const float* q_hat = hat_buf(t) + rl * (NR + 4);
    const float* k_hat = q_hat + kHatStride;

    // S ← decay·S and u's partials (row r into accumulator r % 4).
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int r4 = 0; r4 < NR / 4; ++r4) {
      const float4 kk = reinterpret_cast<const float4*>(k_hat)[r4];
      const float kv[4] = {kk.x, kk.y, kk.z, kk.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = 4 * r4 + e;
        S[r] = __fmul_rn(S[r], decay);
        acc[e] = fmaf(S[r], kv[e], acc[e]);
      }
    }
    const float u = ColumnSum<R>(acc);
    // Token t − 1's output, its butterfly beside u's.
    const float o_prev = ColumnSum<R>(o_acc);
    if (writer && t > 0) out[(t - 1) * p.out_stride] = o_prev;
    const float delta = __fmul_rn(__fsub_rn(v_cur, u), beta);

    // S ← S + k̂·δ and o's partials.
#pragma unroll
    for (int e = 0; e < 4; ++e) o_acc[e] = 0.0f;
#pragma unroll
    for (int r4 = 0; r4 < NR / 4; ++r4) {
      const float4 kk = reinterpret_cast<const float4*>(k_hat)[r4];
      const float4 qq = reinterpret_cast<const float4*>(q_hat)[r4];
      const float kv[4] = {kk.x, kk.y, kk.z, kk.w};
      const float qv[4] = {qq.x, qq.y, qq.z, qq.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = 4 * r4 + e;
        S[r] = fmaf(kv[e], delta, S[r]);
        o_acc[e] = fmaf(S[r], qv[e], o_acc[e]);
      }
    }
    // The state the next token reads: the storage type's value.
#pragma unroll
    for (int r = 0; r < NR; ++r) S[r] = RoundState<ST>(S[r]);

    // Token t + 1 into the other buffer: its last reads were token t − 1's,
    // before the previous iteration's __syncwarp.
    NormalizeInto<M, NR, kHatStride>(in1, q_scale, lane, hat_buf(t + 1));
    __syncwarp();
    v_cur = in1.v;
    in1 = in2;
  }
  {
    const float o_last = ColumnSum<R>(o_acc);
    if (writer) out[(rows - 1) * p.out_stride] = o_last;
  }
  // The next kernel may launch now; it still waits for this grid to finish.
  PdlLetNextLaunch();
#pragma unroll
  for (int r = 0; r < NR; ++r) StoreState(s_col + r * dv, S[r]);
}

// Row-lanes per column for (dk, dv); with it, (dk, dv) fix every order. At
// dk = 128 on the H200 (27B shape), R = 4 (8 columns of 32 rows per warp)
// ran about a third faster than R = 8 and as fast as R = 2, which needs
// half again the registers; above 128, R = 8 keeps a lane's rows (its
// registers of S) at 32 or fewer.
int RowLanes(int64_t dk, int64_t dv) {
  (void)dv;
  return dk > 128 ? 8 : 4;
}

// One wave, spread evenly: warps per block W = ceil(warps / SMs) (at most
// kMaxWarpsPerBlock) and, when the blocks fit one per SM, enough shared
// memory that no SM takes two (the block scheduler would otherwise be free
// to stack blocks, and in a launch of one long wave the busiest SM sets the
// time). Packing changes no arithmetic.
template <int M, int R>
absl::Status Launch(const GatedDeltaRuleParams& p, cudaStream_t stream) {
  auto kernel = p.state_dtype == DType::kBF16
                    ? PrefillGatedDeltaRuleKernel<__nv_bfloat16, M, R>
                    : PrefillGatedDeltaRuleKernel<float, M, R>;
  int device = 0, sms = 0, smem_per_sm = 0, smem_optin = 0;
  SS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), "cudaGetDevice");
  SS_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
      "cudaDeviceGetAttribute");
  SS_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(
          &smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device),
      "cudaDeviceGetAttribute");
  SS_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&smem_optin,
                             cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
      "cudaDeviceGetAttribute");
  const int64_t warps = p.num_v_heads * (p.v_head_dim / (32 / R));
  const int64_t per_block =
      std::min<int64_t>(CeilDiv(warps, sms), kMaxWarpsPerBlock);
  const int64_t blocks = CeilDiv(warps, per_block);
  size_t smem = per_block * HatFloats(32 * M, R) * sizeof(float);
  const size_t spread = static_cast<size_t>(smem_per_sm) / 2 + 1024;
  if (blocks <= sms && spread > smem &&
      spread <= static_cast<size_t>(smem_optin)) {
    smem = spread;
  }
  if (smem > 48 * 1024) {
    SS_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(kernel,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)),
        "cudaFuncSetAttribute");
  }
  LaunchPdl(kernel, dim3(static_cast<unsigned>(blocks)),
            dim3(static_cast<unsigned>(per_block * 32)), smem, stream, p);
  return LaunchStatus("prefill_gated_delta_rule launch");
}

template <int M>
absl::Status LaunchRows(const GatedDeltaRuleParams& p, int row_lanes,
                        cudaStream_t stream) {
  if constexpr (M <= 4) {
    if (row_lanes == 4) return Launch<M, 4>(p, stream);
  } else {
    if (row_lanes == 8) return Launch<M, 8>(p, stream);
  }
  return absl::InternalError("prefill_gated_delta_rule: no kernel for R");
}

}  // namespace

absl::Status LaunchPrefillGatedDeltaRule(const GatedDeltaRuleParams& p,
                                         cudaStream_t stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (p.states != nullptr || p.state_out_stride != 0) {
    return absl::UnimplementedError(
        "prefill_gated_delta_rule: single state slot only (no session "
        "batch, no snapshots)");
  }
  const int64_t dk = p.k_head_dim, dv = p.v_head_dim;
  if (dk % 32 != 0 || dk > kMaxKeyDim || dv % 32 != 0 || dv > kMaxValueDim) {
    return absl::UnimplementedError(
        "prefill_gated_delta_rule: dk and dv must be multiples of 32, at "
        "most 256");
  }
  if (p.num_v_heads * dv > (int64_t{1} << 30)) {
    return absl::UnimplementedError("prefill_gated_delta_rule: too many heads");
  }
  const int row_lanes = RowLanes(dk, dv);
  switch (dk / 32) {
    case 1:
      return LaunchRows<1>(p, row_lanes, stream);
    case 2:
      return LaunchRows<2>(p, row_lanes, stream);
    case 3:
      return LaunchRows<3>(p, row_lanes, stream);
    case 4:
      return LaunchRows<4>(p, row_lanes, stream);
    case 5:
      return LaunchRows<5>(p, row_lanes, stream);
    case 6:
      return LaunchRows<6>(p, row_lanes, stream);
    case 7:
      return LaunchRows<7>(p, row_lanes, stream);
    default:
      return LaunchRows<8>(p, row_lanes, stream);
  }
  return LaunchStatus("prefill_gated_delta_rule launch");
}

}  // namespace specserve::kernels::cuda
