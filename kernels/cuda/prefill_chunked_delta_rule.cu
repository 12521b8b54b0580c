// The chunked form of the gated delta rule for a prompt (ops.h
// LaunchPrefillChunkedDeltaRule): the prefill form for dk = 128, on the
// tensor cores (tf32 mma.sync, fp32 accumulation), under the prefill
// tolerance contract (docs/DESIGN.md "Prefill tolerance").
//
// Algorithm. Tokens are taken in chunks of C = kPrefillDeltaRuleChunk at
// absolute positions (chunk c holds positions [cC, cC + C)). Within a
// chunk, with S0 the state before it, G_t the inclusive sum of the log
// decays g (g = −exp(A_log)·softplus(a + dt_bias)), β_t = sigmoid(b_t) and
// k̂, q̂ the normalised keys and queries (gated_delta_rule.h), the
// per-token recurrence unrolls to
//   (I + A)·Δ = R,  A[t][s] = β_t·e^(G_t−G_s)·k̂_t·k̂_s (s < t),
//   R_t = β_t·(v_t − e^(G_t)·S0ᵀk̂_t),
//   o_t = e^(G_t)·S0ᵀq̂_t + Σ_{s<=t} e^(G_t−G_s)·(q̂_t·k̂_s)·Δ_s,
//   S_C = e^(G_last)·S0 + Σ_s e^(G_last−G_s)·k̂_s·Δ_sᵀ,
// where Δ_t is the token's update δ_t = β_t(v_t − u_t) of the per-token
// form. (I + A) is unit lower triangular; it is solved by 16-row blocks:
// Δ_b = (I + A_bb)⁻¹·(R_b − Σ_{m<b} A_bm·Δ_m), the 16 × 16 inverses by
// forward substitution. Every exponent is <= 0 (G falls along the chunk).
//
// Mapping. A block is one value head and kJ = 64 of its state columns
// (columns are independent: A, P and the gates are the same for all; each
// block recomputes them). Its 8 warps keep the block's 128 × 64 fp32 state
// in registers as mma accumulators (warp w: rows 32(w % 4), columns
// 32(w / 4)), and per chunk, with a block barrier between phases:
//  1. the state's tf32 copy into shared memory; the gates and their
//     prefix sum (warp 0); k̂, q̂ (one row per warp step) and the value
//     columns into shared memory;
//  2. [K̂; Q̂]·K̂ᵀ → A and P (masked, decay-scaled);
//  3. the four diagonal inverses (warps 0-3) and [K̂; Q̂]·S0 → R (into the
//     value buffer) and e^G·Q̂S0 (kept in the warps that hold it);
//  4. the block solve, each warp over its own 8 columns (warp barriers
//     only);
//  5. S ← e^(G_last)·S + K̂ᵀ·Δ′ and o = e^G·Q̂S0 + P·Δ, written out.
// Operands are rounded to tf32 (round to nearest) when stored to shared
// memory; every mma accumulates in fp32. Masked rows (before the call's
// first token or past its last in a partial chunk) have k̂ = q̂ = 0, β = 0
// and g = 0, so they change neither the state nor any other row.
//
// Determinism and chunking. Every sum's order is fixed by the chunk grid
// alone, so a token's bits depend on its inputs, the state at its chunk's
// start and which rows of its chunk the call holds: the same prompt split
// into calls at multiples of C (at absolute positions) gives one call's
// bits; a call starting or ending inside a chunk agrees within tolerance.
// The inputs are read through the read-only cache: no output may overlap
// them; state_in may be state_out (a block reads its slice first and
// writes it last). Several sessions' calls in one launch (a PrefillBatch
// pass: LaunchPrefillChunkedDeltaRuleSlices) are one grid row each, each
// block doing exactly its own call's work: the same bits.
//
// State storage (ST: float or __nv_bfloat16, GatedDeltaRuleParams
// state_dtype): widened on load, and the state a chunk hands to the next
// (and stores at the end) is rounded to ST (RoundState) at the end of each
// chunk the call holds, the CPU chunked form's points; within a chunk the
// arithmetic is fp32 as above.
#include <cstdint>

#include "absl/types/span.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/state_elem.cuh"
#include "kernels/gated_delta_rule.h"

namespace specserve::kernels::cuda {
namespace {

constexpr int kDk = 128;
constexpr int kC = static_cast<int>(kPrefillDeltaRuleChunk);
constexpr int kJ = 64;  // state columns per block
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
// Row strides (floats) chosen so that the mma fragment loads hit 32
// distinct banks: rows read as A (row g, column q) want a stride of 4 mod
// 32, rows read as B (row q, column g) a stride of 8 mod 32.
constexpr int kKStride = kDk + 4;  // k̂, q̂: read as A and as Bᵀ
constexpr int kJStride = kJ + 8;   // state copy, R/Δ, Δ′: read as B
constexpr int kCStride = kC + 4;   // A/T, P: read as A
static_assert(kC == 64, "the phases below tile a 64-token chunk");

struct Smem {
  float kh[kC][kKStride];
  float qh[kC][kKStride];
  float s0[kDk][kJStride];  // the state before the chunk, tf32
  float vd[kC][kJStride];   // v (fp32), then R (fp32), then Δ (tf32)
  float dp[kC][kJStride];   // Δ′_t = e^(G_last − G_t)·Δ_t, tf32
  float am[kC][kCStride];   // A, tf32; its diagonal 16-blocks then hold
                            // (I + A_bb)⁻¹
  float pm[kC][kCStride];   // P, tf32
  float gcum[kC];           // G_t
  float beta[kC];
};

__device__ __forceinline__ uint32_t Tf32Bits(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float RoundTf32(float x) {
  return __uint_as_float(Tf32Bits(x));
}
__device__ __forceinline__ uint32_t Bits(float x) { return __float_as_uint(x); }

// d += a·b for one m16n8k8 tile (tf32 inputs, fp32 accumulators).
__device__ __forceinline__ void MmaTf32(float (&d)[4], const uint32_t (&a)[4],
                                        const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// c[m][n] += Σ_k A(16m + r, k)·B(k, 8n + c) over k = 0 .. 8·ksteps − 1 for
// the warp's tile of MT × NT mma tiles; a(r, k) and b(k, c) give the tf32
// bits of the tile-relative elements. In k order, one k8 slice per mma.
// Accumulator (m, n, i) is row 16m + g + 8(i / 2), column 8n + 2q + i % 2.
template <int MT, int NT, typename FA, typename FB>
__device__ __forceinline__ void WarpMma(float (&c)[MT][NT][4], int ksteps, FA a,
                                        FB b) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll 2
  for (int ks = 0; ks < ksteps; ++ks) {
    const int k = 8 * ks;
    uint32_t af[MT][4], bf[NT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      af[m][0] = a(16 * m + g, k + q);
      af[m][1] = a(16 * m + g + 8, k + q);
      af[m][2] = a(16 * m + g, k + q + 4);
      af[m][3] = a(16 * m + g + 8, k + q + 4);
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      bf[n][0] = b(k + q, 8 * n + g);
      bf[n][1] = b(k + q + 4, 8 * n + g);
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
      for (int n = 0; n < NT; ++n) MmaTf32(c[m][n], af[m], bf[n]);
    }
  }
}

template <int MT, int NT>
__device__ __forceinline__ void Zero(float (&c)[MT][NT][4]) {
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) c[m][n][i] = 0.0f;
    }
  }
}

// Calls f(row, col, value&) for every accumulator of a warp tile.
template <int MT, int NT, typename F>
__device__ __forceinline__ void ForEach(float (&c)[MT][NT][4], F f) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        f(16 * m + g + 8 * (i >> 1), 8 * n + 2 * q + (i & 1), c[m][n][i]);
      }
    }
  }
}

// Several sessions' tokens in one launch (LaunchPrefillChunkedDeltaRule
// Slices): grid row y is slice y, with its own rows, position, inputs,
// outputs and state from the table; a block does what the slice's own
// launch gives it. count 0: one slice, p's.
struct DeltaSlices {
  int count;
  int64_t rows[kMaxLaunchSlices];
  int64_t position[kMaxLaunchSlices];
  const float* q[kMaxLaunchSlices];
  const float* k[kMaxLaunchSlices];
  const float* v[kMaxLaunchSlices];
  const float* a[kMaxLaunchSlices];
  const float* b[kMaxLaunchSlices];
  const void* state_in[kMaxLaunchSlices];
  void* state_out[kMaxLaunchSlices];
  float* out[kMaxLaunchSlices];
};

__device__ __forceinline__ GatedDeltaRuleParams
SliceOf(const GatedDeltaRuleParams& shared, const DeltaSlices& t, int i) {
  GatedDeltaRuleParams p = shared;
  p.rows = t.rows[i];
  p.position = t.position[i];
  p.q = t.q[i];
  p.k = t.k[i];
  p.v = t.v[i];
  p.a = t.a[i];
  p.b = t.b[i];
  p.state_in = t.state_in[i];
  p.state_out = t.state_out[i];
  p.out = t.out[i];
  return p;
}

template <typename ST>
__global__ void __launch_bounds__(kThreads, 1)
    ChunkedDeltaRuleKernel(const __grid_constant__ GatedDeltaRuleParams shared,
                           const __grid_constant__ DeltaSlices table) {
  const GatedDeltaRuleParams p =
      table.count > 0 ? SliceOf(shared, table, static_cast<int>(blockIdx.y))
                      : shared;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  const int64_t dv = p.v_head_dim;
  const int slices = static_cast<int>(dv / kJ);
  const int h = static_cast<int>(blockIdx.x) / slices;
  const int j0 = (static_cast<int>(blockIdx.x) % slices) * kJ;
  const int key_head = h / static_cast<int>(p.num_v_heads / p.num_k_heads);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int rb = warp & 3, cb = warp >> 2;  // the warp's 32-row, 32-col block
  const float* const qsrc = p.q + key_head * kDk;
  const float* const ksrc = p.k + key_head * kDk;
  const float* const vsrc = p.v + h * dv + j0;
  const int64_t qs = p.qkv_stride;
  const float a_coef = -expf(__ldg(p.a_log + h));
  const float dt_bias = __ldg(p.dt_bias + h);
  const float q_scale = 1.0f / sqrtf(static_cast<float>(kDk));
  const ST* const st_in =
      static_cast<const ST*>(p.state_in) + h * kDk * dv + j0;
  ST* const st_out = static_cast<ST*>(p.state_out) + h * kDk * dv + j0;

  // The warp's tile of the state: rows 32rb.., columns 32cb.. .
  float S[2][4][4];
  ForEach(S, [&](int r, int c, float& v) {
    v = LoadState(st_in + (32 * rb + r) * dv + 32 * cb + c);
  });

  const int64_t T = p.rows;
  const int64_t first = p.position % kC;  // row 0's place in its chunk
  for (int64_t base = -first; base < T; base += kC) {
    const int lo = base < 0 ? static_cast<int>(-base) : 0;
    const int hi = static_cast<int>(T - base < kC ? T - base : kC);
    // The next chunk's rows into L2 while this one runs: per row 4 lines
    // of q, 4 of k and 2 of v.
    for (int l = tid; l < 10 * kC; l += kThreads) {
      const int64_t row = base + kC + l / 10;
      const int part = l % 10;
      if (row < T) {
        const float* at = part < 4   ? qsrc + row * qs + 32 * part
                          : part < 8 ? ksrc + row * qs + 32 * (part - 4)
                                     : vsrc + row * qs + 32 * (part - 8);
        PrefetchL2(at);
      }
    }

    // Phase 1: the state's tf32 copy; gates; k̂, q̂ and v.
    ForEach(S, [&](int r, int c, float& v) {
      sm.s0[32 * rb + r][32 * cb + c] = RoundTf32(v);
    });
    if (warp == 0) {
      float gl[2], bl[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int t = lane + 32 * e;
        const bool valid = t >= lo && t < hi;
        gl[e] = 0.0f;
        bl[e] = 0.0f;
        if (valid) {
          const int64_t i = (base + t) * p.ab_stride + h;
          gl[e] = a_coef * Softplus(__ldg(p.a + i) + dt_bias);
          bl[e] = Sigmoid(__ldg(p.b + i));
        }
      }
      // Inclusive prefix sums over 64 tokens (a fixed shuffle order).
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const float x0 = __shfl_up_sync(0xffffffffu, gl[0], off);
        const float x1 = __shfl_up_sync(0xffffffffu, gl[1], off);
        if (lane >= off) {
          gl[0] += x0;
          gl[1] += x1;
        }
      }
      gl[1] += __shfl_sync(0xffffffffu, gl[0], 31);
      sm.gcum[lane] = gl[0];
      sm.gcum[lane + 32] = gl[1];
      sm.beta[lane] = bl[0];
      sm.beta[lane + 32] = bl[1];
    }
    for (int t = warp; t < kC; t += kWarps) {
      const bool valid = t >= lo && t < hi;
      float4 qv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), kv = qv;
      float2 vv = make_float2(0.0f, 0.0f);
      if (valid) {
        const int64_t row = base + t;
        qv = __ldg(reinterpret_cast<const float4*>(qsrc + row * qs) + lane);
        kv = __ldg(reinterpret_cast<const float4*>(ksrc + row * qs) + lane);
        vv = __ldg(reinterpret_cast<const float2*>(vsrc + row * qs) + lane);
      }
      const float sq =
          WarpSum(qv.x * qv.x + qv.y * qv.y + qv.z * qv.z + qv.w * qv.w);
      const float sk =
          WarpSum(kv.x * kv.x + kv.y * kv.y + kv.z * kv.z + kv.w * kv.w);
      const float iq = q_scale / sqrtf(sq + 1e-6f);
      const float ik = 1.0f / sqrtf(sk + 1e-6f);
      float* qd = &sm.qh[t][4 * lane];
      float* kd = &sm.kh[t][4 * lane];
      qd[0] = RoundTf32(qv.x * iq);
      qd[1] = RoundTf32(qv.y * iq);
      qd[2] = RoundTf32(qv.z * iq);
      qd[3] = RoundTf32(qv.w * iq);
      kd[0] = RoundTf32(kv.x * ik);
      kd[1] = RoundTf32(kv.y * ik);
      kd[2] = RoundTf32(kv.z * ik);
      kd[3] = RoundTf32(kv.w * ik);
      sm.vd[t][2 * lane] = vv.x;
      sm.vd[t][2 * lane + 1] = vv.y;
    }
    __syncthreads();

    // Phase 2: A (rows of K̂, rb 0-1) and P (rows of Q̂, rb 2-3); the tile
    // wholly above the diagonal (rows 0-31, columns 32-63) is never read.
    {
      const bool is_p = rb >= 2;
      const int r0 = 32 * (rb & 1), c0 = 32 * cb;
      if (c0 <= r0) {
        const float(*src)[kKStride] = is_p ? sm.qh : sm.kh;
        float acc[2][4][4];
        Zero(acc);
        WarpMma<2, 4>(
            acc, kDk / 8, [&](int r, int k) { return Bits(src[r0 + r][k]); },
            [&](int k, int c) { return Bits(sm.kh[c0 + c][k]); });
        ForEach(acc, [&](int r, int c, float& v) {
          const int t = r0 + r, s = c0 + c;
          const float decay = expf(sm.gcum[t] - sm.gcum[s]);
          if (is_p) {
            sm.pm[t][s] = s <= t ? RoundTf32(decay * v) : 0.0f;
          } else {
            sm.am[t][s] = s < t ? RoundTf32(sm.beta[t] * decay * v) : 0.0f;
          }
        });
      }
    }
    __syncthreads();

    // Phase 3: the diagonal inverses (warps 0-3, block `warp`, lane j <
    // 16 its column j); then [K̂; Q̂]·S0.
    if (warp < 4) {
      const int b0 = 16 * warp, j = lane & 15;
      float x[16];
#pragma unroll
      for (int t = 0; t < 16; ++t) {
        float s = t == j ? 1.0f : 0.0f;
#pragma unroll
        for (int u = 0; u < t; ++u) s = fmaf(-sm.am[b0 + t][b0 + u], x[u], s);
        x[t] = s;
      }
      __syncwarp();
      if (lane < 16) {
#pragma unroll
        for (int t = 0; t < 16; ++t) sm.am[b0 + t][b0 + j] = RoundTf32(x[t]);
      }
    }
    float o[2][4][4];  // rb 2-3: e^G·Q̂S0, then the output
    {
      const float(*src)[kKStride] = rb >= 2 ? sm.qh : sm.kh;
      const int r0 = 32 * (rb & 1), c0 = 32 * cb;
      Zero(o);
      WarpMma<2, 4>(
          o, kDk / 8, [&](int r, int k) { return Bits(src[r0 + r][k]); },
          [&](int k, int c) { return Bits(sm.s0[k][c0 + c]); });
      ForEach(o, [&](int r, int c, float& v) {
        const int t = r0 + r;
        const float gamma = expf(sm.gcum[t]);
        if (rb < 2) {
          float& vr = sm.vd[t][c0 + c];
          vr = sm.beta[t] * (vr - gamma * v);  // R_t
        } else {
          v *= gamma;
        }
      });
    }
    __syncthreads();

    // Phase 4: the block solve; warp w owns columns 8w .. 8w + 7.
    {
      const int c0 = 8 * warp;
      const float g_last = sm.gcum[kC - 1];
#pragma unroll 1
      for (int b = 0; b < 4; ++b) {
        const int b0 = 16 * b;
        float y[1][1][4];
        Zero(y);
        if (b > 0) {
          WarpMma<1, 1>(
              y, 2 * b, [&](int r, int k) { return Bits(sm.am[b0 + r][k]); },
              [&](int k, int c) { return Bits(sm.vd[k][c0 + c]); });
        }
        // X = R_b − Σ A_bm·Δ_m, in place of R_b (each element is read and
        // written by one lane).
        ForEach(y, [&](int r, int c, float& v) {
          float& x = sm.vd[b0 + r][c0 + c];
          x = RoundTf32(x - v);
        });
        __syncwarp();
        float d[1][1][4];
        Zero(d);
        WarpMma<1, 1>(
            d, 2, [&](int r, int k) { return Bits(sm.am[b0 + r][b0 + k]); },
            [&](int k, int c) { return Bits(sm.vd[b0 + k][c0 + c]); });
        __syncwarp();
        ForEach(d, [&](int r, int c, float& v) {
          const int t = b0 + r;
          sm.vd[t][c0 + c] = RoundTf32(v);
          sm.dp[t][c0 + c] = RoundTf32(expf(g_last - sm.gcum[t]) * v);
        });
        __syncwarp();
      }
    }
    __syncthreads();

    // Phase 5: the state and the outputs.
    {
      const float decay = expf(sm.gcum[kC - 1]);
      ForEach(S, [&](int, int, float& v) { v *= decay; });
      WarpMma<2, 4>(
          S, kC / 8, [&](int r, int k) { return Bits(sm.kh[k][32 * rb + r]); },
          [&](int k, int c) { return Bits(sm.dp[k][32 * cb + c]); });
      if (rb >= 2) {
        const int r0 = 32 * (rb & 1), c0 = 32 * cb;
        WarpMma<2, 4>(
            o, (r0 + 32) / 8,
            [&](int r, int k) { return Bits(sm.pm[r0 + r][k]); },
            [&](int k, int c) { return Bits(sm.vd[k][c0 + c]); });
        ForEach(o, [&](int r, int c, float& v) {
          const int t = r0 + r;
          if (t >= lo && t < hi) {
            p.out[(base + t) * p.out_stride + h * dv + j0 + c0 + c] = v;
          }
        });
      }
    }
    // The state handed to the next chunk: the storage type's value.
    ForEach(S, [&](int, int, float& v) { v = RoundState<ST>(v); });
    __syncthreads();
  }
  ForEach(S, [&](int r, int c, float& v) {
    StoreState(st_out + (32 * rb + r) * dv + 32 * cb + c, v);
  });
}

}  // namespace

namespace {

// What LaunchPrefillChunkedDeltaRule refuses of one call before launching.
absl::Status CheckChunked(const GatedDeltaRuleParams& p) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (p.states != nullptr || p.state_out_stride != 0) {
    return absl::UnimplementedError(
        "prefill chunked delta rule: single state slot only");
  }
  auto aligned = [](const void* ptr, uintptr_t bytes) {
    return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
  };
  if (p.k_head_dim != kDk || p.v_head_dim % kJ != 0 || p.qkv_stride % 4 != 0 ||
      !aligned(p.q, 16) || !aligned(p.k, 16) || !aligned(p.v, 8)) {
    return absl::UnimplementedError(
        "prefill chunked delta rule: needs dk = 128, dv % 64 == 0 and "
        "16-byte aligned q/k rows");
  }
  if (p.position < 0) {
    return absl::InvalidArgumentError(
        "prefill chunked delta rule: negative position");
  }
  return absl::OkStatus();
}

// The fields every slice of one launch shares (read from the first).
bool SameDeltaShape(const GatedDeltaRuleParams& a,
                    const GatedDeltaRuleParams& b) {
  return a.num_k_heads == b.num_k_heads && a.num_v_heads == b.num_v_heads &&
         a.k_head_dim == b.k_head_dim && a.v_head_dim == b.v_head_dim &&
         a.qkv_stride == b.qkv_stride && a.ab_stride == b.ab_stride &&
         a.a_log == b.a_log && a.dt_bias == b.dt_bias &&
         a.state_dtype == b.state_dtype && a.out_stride == b.out_stride;
}

absl::Status Launch(const GatedDeltaRuleParams& p, const DeltaSlices& t,
                    cudaStream_t stream) {
  const size_t smem = sizeof(Smem);
  auto kernel = p.state_dtype == DType::kBF16
                    ? ChunkedDeltaRuleKernel<__nv_bfloat16>
                    : ChunkedDeltaRuleKernel<float>;
  SS_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem)),
      "prefill chunked delta rule smem attribute");
  const int64_t blocks = p.num_v_heads * (p.v_head_dim / kJ);
  const dim3 grid(static_cast<unsigned>(blocks),
                  static_cast<unsigned>(t.count > 0 ? t.count : 1));
  kernel<<<grid, kThreads, smem, stream>>>(p, t);
  return LaunchStatus("prefill chunked delta rule launch");
}

}  // namespace

absl::Status LaunchPrefillChunkedDeltaRule(const GatedDeltaRuleParams& p,
                                           cudaStream_t stream) {
  if (absl::Status s = CheckChunked(p); !s.ok()) return s;
  return Launch(p, DeltaSlices{}, stream);
}

absl::Status LaunchPrefillChunkedDeltaRuleSlices(
    absl::Span<const GatedDeltaRuleParams> slices, cudaStream_t stream) {
  if (slices.empty()) return absl::OkStatus();
  for (const GatedDeltaRuleParams& p : slices) {
    if (absl::Status s = CheckChunked(p); !s.ok()) return s;
    if (!SameDeltaShape(p, slices[0])) {
      return absl::InvalidArgumentError(
          "prefill chunked delta rule: the slices of one call differ in "
          "heads, strides, gates or state type");
    }
  }
  return ForEachLaunchPart(slices,
                           [&](absl::Span<const GatedDeltaRuleParams> part) {
                             DeltaSlices t{};
                             t.count = static_cast<int>(part.size());
                             for (int j = 0; j < t.count; ++j) {
                               const GatedDeltaRuleParams& p = part[j];
                               t.rows[j] = p.rows;
                               t.position[j] = p.position;
                               t.q[j] = p.q;
                               t.k[j] = p.k;
                               t.v[j] = p.v;
                               t.a[j] = p.a;
                               t.b[j] = p.b;
                               t.state_in[j] = p.state_in;
                               t.state_out[j] = p.state_out;
                               t.out[j] = p.out;
                             }
                             return Launch(part[0], t, stream);
                           });
}

}  // namespace specserve::kernels::cuda
