// Gated delta rule, per-token recurrent form (kernels/gated_delta_rule.h).
//
// The state columns j of one value head are independent: u_j = Σ_i S[i][j]k̂_i
// and o_j = Σ_i S'[i][j]q̂_i only mix entries of column j. A block owns 32
// columns of one head (blockIdx = (column tile, head)) and keeps that
// [dk][32] slice of S in shared memory across all T tokens; its 4 warps
// split the dk rows into 4 fixed ranges (by dk only), and each column's two
// reductions add the 4 range partials as (p0+p1)+(p2+p3). Every token runs
// the same instructions whatever T and whichever snapshot mode, so verify
// column t == decode at that position bit for bit. A session batch
// (p.states) gives each row its own blocks (blockIdx.z = row), which run
// the one-row call's instructions on that row's state, in place.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"

namespace specserve::kernels::cuda {
namespace {

constexpr int kParts = 4;  // warps per block = row ranges of S
constexpr int kThreads = kParts * 32;
constexpr int kMaxKeyDim = 256;

// Shared memory: S[dk][32] | qn[dk] | kn[dk] | red[2][kParts][32] | scal[4].
size_t SharedBytes(int64_t dk) {
  return (dk * 32 + 2 * dk + 2 * kParts * 32 + 4) * sizeof(float);
}

// ‖x‖-normalizes x[0..n) times `scale` into out, by one warp.
__device__ __forceinline__ void L2NormalizeWarp(const float* x, int n, float scale,
                                                float* out, int lane) {
  float ss = 0.0f;
  for (int i = lane; i < n; i += 32) ss = fmaf(x[i], x[i], ss);
  ss = WarpSum(ss);
  const float inv = 1.0f / sqrtf(__fadd_rn(ss, 1e-6f));
  for (int i = lane; i < n; i += 32) out[i] = __fmul_rn(__fmul_rn(x[i], inv), scale);
}

__global__ void __launch_bounds__(kThreads) GatedDeltaRuleKernel(GatedDeltaRuleParams p) {
  extern __shared__ float smem[];
  const int dk = static_cast<int>(p.k_head_dim);
  const int64_t dv = p.v_head_dim;
  float* S = smem;                        // [dk][32]
  float* qn = S + dk * 32;                // [dk]
  float* kn = qn + dk;                    // [dk]
  float* red = kn + dk;                   // [2][kParts][32]
  float* scal = red + 2 * kParts * 32;    // beta, decay

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t h = blockIdx.y;
  const int64_t kh = h / (p.num_v_heads / p.num_k_heads);
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  const bool col = j < dv;
  const int part = (dk + kParts - 1) / kParts;
  const int i_begin = min(dk, warp * part);
  const int i_end = min(dk, i_begin + part);
  const int64_t head_size = static_cast<int64_t>(dk) * dv;
  const float q_scale = 1.0f / sqrtf(static_cast<float>(dk));
  const float a_coef = -expf(p.a_log[h]);
  const bool batch = p.states != nullptr;
  const int64_t t0 = batch ? blockIdx.z : 0;
  const int64_t t1 = batch ? t0 + 1 : p.rows;
  const float* state_in = batch ? p.states[t0] : p.state_in;
  float* state_out = batch ? p.states[t0] : p.state_out;

  {
    const float* src = state_in + h * head_size;
    for (int i = i_begin; i < i_end; ++i) S[i * 32 + lane] = col ? src[i * dv + j] : 0.0f;
  }

  for (int64_t t = t0; t < t1; ++t) {
    __syncthreads();  // the previous token is done with qn, kn, red, scal
    if (warp == 0) {
      L2NormalizeWarp(p.q + t * p.qkv_stride + kh * dk, dk, q_scale, qn, lane);
    } else if (warp == 1) {
      L2NormalizeWarp(p.k + t * p.qkv_stride + kh * dk, dk, 1.0f, kn, lane);
    } else if (warp == 2 && lane == 0) {
      const float b = p.b[t * p.ab_stride + h];
      const float a = p.a[t * p.ab_stride + h];
      scal[0] = Sigmoid(b);
      scal[1] = expf(__fmul_rn(a_coef, Softplus(__fadd_rn(a, p.dt_bias[h]))));
    }
    __syncthreads();
    const float beta = scal[0];
    const float decay = scal[1];

    // S ← decay·S and this range's part of u = Sᵀk̂.
    float pu = 0.0f;
    for (int i = i_begin; i < i_end; ++i) {
      const float sd = __fmul_rn(S[i * 32 + lane], decay);
      S[i * 32 + lane] = sd;
      pu = fmaf(sd, kn[i], pu);
    }
    red[warp * 32 + lane] = pu;
    __syncthreads();
    const float u = __fadd_rn(__fadd_rn(red[0 * 32 + lane], red[1 * 32 + lane]),
                              __fadd_rn(red[2 * 32 + lane], red[3 * 32 + lane]));
    const float v = col ? p.v[t * p.qkv_stride + h * dv + j] : 0.0f;
    const float delta = __fmul_rn(__fsub_rn(v, u), beta);

    // S ← S + k̂·δᵀ and this range's part of o = Sᵀq̂; snapshot.
    const bool snap = col && (p.state_out_stride != 0 || t == t1 - 1);
    float* dst = state_out + (t - t0) * p.state_out_stride + h * head_size;
    float po = 0.0f;
    for (int i = i_begin; i < i_end; ++i) {
      const float sn = fmaf(kn[i], delta, S[i * 32 + lane]);
      S[i * 32 + lane] = sn;
      po = fmaf(sn, qn[i], po);
      if (snap) dst[i * dv + j] = sn;
    }
    red[(kParts + warp) * 32 + lane] = po;
    __syncthreads();
    if (warp == 0 && col) {
      const float* r = red + kParts * 32;
      p.out[t * p.out_stride + h * dv + j] =
          __fadd_rn(__fadd_rn(r[0 * 32 + lane], r[1 * 32 + lane]),
                    __fadd_rn(r[2 * 32 + lane], r[3 * 32 + lane]));
    }
  }
}

}  // namespace

absl::Status LaunchGatedDeltaRule(const GatedDeltaRuleParams& p, cudaStream_t stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (p.k_head_dim > kMaxKeyDim) {
    return absl::UnimplementedError("gated_delta_rule: k_head_dim > 256 unsupported");
  }
  if (p.num_v_heads > 65535) {
    return absl::UnimplementedError("gated_delta_rule: more than 65535 value heads");
  }
  const size_t smem = SharedBytes(p.k_head_dim);
  if (smem > 48 * 1024) {
    SS_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(GatedDeltaRuleKernel,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)),
        "gated_delta_rule smem attribute");
  }
  if (p.states != nullptr && p.rows > 65535) {
    return absl::UnimplementedError("gated_delta_rule: session batch of more than 65535 rows");
  }
  const dim3 grid(static_cast<unsigned>(CeilDiv(p.v_head_dim, 32)),
                  static_cast<unsigned>(p.num_v_heads),
                  p.states != nullptr ? static_cast<unsigned>(p.rows) : 1u);
  GatedDeltaRuleKernel<<<grid, kThreads, smem, stream>>>(p);
  return LaunchStatus("gated_delta_rule launch");
}

}  // namespace specserve::kernels::cuda
