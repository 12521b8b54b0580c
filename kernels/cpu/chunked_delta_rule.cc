#include "kernels/cpu/chunked_delta_rule.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "glog/logging.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gated_delta_rule.h"

namespace specserve::kernels::cpu {
namespace {

constexpr int64_t kC = kPrefillDeltaRuleChunk;

// a·b over n elements, summed in index order.
float Dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// One head's working memory for a segment of up to kC tokens.
struct Scratch {
  std::vector<float> qn, kn, w;  // [kC][dk] each
  std::vector<float> u, vn;      // [kC][dv] each: u, then v_new
  std::vector<float> a, pm;      // [kC][kC]: A, and P = QKᵀ ⊙ decay
  std::vector<float> beta, gcum, eg, dlast;  // [kC]
  std::vector<float> o;                      // [dv]

  void Size(int64_t dk, int64_t dv) {
    qn.resize(kC * dk);
    kn.resize(kC * dk);
    w.resize(kC * dk);
    u.resize(kC * dv);
    vn.resize(kC * dv);
    a.resize(kC * kC);
    pm.resize(kC * kC);
    beta.resize(kC);
    gcum.resize(kC);
    eg.resize(kC);
    dlast.resize(kC);
    o.resize(dv);
  }
};

// Tokens [c0, c0 + n) of head h, n <= kC, from the state S ([dk][dv], the
// head's slice of state_out) to the state after them, in place.
void RunSegment(const GatedDeltaRuleParams& p, int64_t h, int64_t c0, int64_t n,
                float* S, Scratch& sc) {
  const int64_t dk = p.k_head_dim, dv = p.v_head_dim;
  const int64_t kh = h / (p.num_v_heads / p.num_k_heads);
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  const float a_coef = -std::exp(p.a_log[h]);
  float* const qn = sc.qn.data();
  float* const kn = sc.kn.data();
  float* const w = sc.w.data();
  float* const u = sc.u.data();
  float* const vn = sc.vn.data();
  float* const am = sc.a.data();
  float* const pm = sc.pm.data();

  // Gates, their running sum and the normalised q̂, k̂.
  float g_sum = 0.0f;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t r = c0 + t;
    L2Normalize(p.q + r * p.qkv_stride + kh * dk, dk, q_scale, qn + t * dk);
    L2Normalize(p.k + r * p.qkv_stride + kh * dk, dk, 1.0f, kn + t * dk);
    sc.beta[t] = Sigmoid(p.b[r * p.ab_stride + h]);
    g_sum += a_coef * Softplus(p.a[r * p.ab_stride + h] + p.dt_bias[h]);
    sc.gcum[t] = g_sum;
    sc.eg[t] = std::exp(g_sum);
  }
  // A (strictly lower) and P (lower, diagonal included), row t from rows
  // s <= t only.
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t s = 0; s <= t; ++s) {
      const float decay = std::exp(sc.gcum[t] - sc.gcum[s]);
      pm[t * kC + s] = decay * Dot(qn + t * dk, kn + s * dk, dk);
      if (s < t) {
        am[t * kC + s] =
            sc.beta[t] * (decay * Dot(kn + t * dk, kn + s * dk, dk));
      }
    }
  }
  // Row by row: w_t and u_t by forward substitution (from the w_s, u_s of
  // the rows before), v_new_t = u_t − S0ᵀw_t, then o_t. S is still S0 here.
  for (int64_t t = 0; t < n; ++t) {
    const int64_t r = c0 + t;
    float* wt = w + t * dk;
    float* ut = u + t * dv;
    float* vt = vn + t * dv;
    const float* v = p.v + r * p.qkv_stride + h * dv;
    const float* kt = kn + t * dk;
    const float bg = sc.beta[t] * sc.eg[t];
    for (int64_t i = 0; i < dk; ++i) wt[i] = bg * kt[i];
    for (int64_t j = 0; j < dv; ++j) ut[j] = sc.beta[t] * v[j];
    for (int64_t s = 0; s < t; ++s) {
      const float c = am[t * kC + s];
      const float* ws = w + s * dk;
      const float* us = u + s * dv;
      for (int64_t i = 0; i < dk; ++i) wt[i] -= c * ws[i];
      for (int64_t j = 0; j < dv; ++j) ut[j] -= c * us[j];
    }
    // v_new_t = u_t − S0ᵀw_t and S0ᵀq̂_t in one pass over S0.
    float* o = sc.o.data();
    for (int64_t j = 0; j < dv; ++j) {
      vt[j] = ut[j];
      o[j] = 0.0f;
    }
    const float* qt = qn + t * dk;
    for (int64_t i = 0; i < dk; ++i) {
      const float* si = S + i * dv;
      const float wi = wt[i], qi = qt[i];
      for (int64_t j = 0; j < dv; ++j) {
        vt[j] -= wi * si[j];
        o[j] += qi * si[j];
      }
    }
    const float et = sc.eg[t];
    for (int64_t j = 0; j < dv; ++j) o[j] *= et;
    for (int64_t s = 0; s <= t; ++s) {
      const float c = pm[t * kC + s];
      const float* vs = vn + s * dv;
      for (int64_t j = 0; j < dv; ++j) o[j] += c * vs[j];
    }
    float* out = p.out + r * p.out_stride + h * dv;
    std::memcpy(out, o, dv * sizeof(float));
  }
  // S ← e^(G_last)·S0 + Σ_s e^(G_last−G_s)·k̂_s·v_new_sᵀ, s in order.
  const float g_last = sc.gcum[n - 1];
  const float e_last = sc.eg[n - 1];
  for (int64_t s = 0; s < n; ++s) sc.dlast[s] = std::exp(g_last - sc.gcum[s]);
  for (int64_t i = 0; i < dk; ++i) {
    float* si = S + i * dv;
    for (int64_t j = 0; j < dv; ++j) si[j] *= e_last;
    for (int64_t s = 0; s < n; ++s) {
      const float c = kn[s * dk + i] * sc.dlast[s];
      const float* vs = vn + s * dv;
      for (int64_t j = 0; j < dv; ++j) si[j] += c * vs[j];
    }
  }
}

void RunHead(const GatedDeltaRuleParams& p, int64_t h) {
  const int64_t head_size = p.k_head_dim * p.v_head_dim;
  const bool bf16 = p.state_dtype == DType::kBF16;
  thread_local Scratch sc;
  thread_local std::vector<float> work;  // bf16 storage: S widened
  sc.Size(p.k_head_dim, p.v_head_dim);
  float* S;
  if (bf16) {
    work.resize(head_size);
    S = work.data();
    const uint16_t* src =
        static_cast<const uint16_t*>(p.state_in) + h * head_size;
    for (int64_t i = 0; i < head_size; ++i) S[i] = Bf16ToFloat(src[i]);
  } else {
    S = static_cast<float*>(p.state_out) + h * head_size;
    const float* src = static_cast<const float*>(p.state_in) + h * head_size;
    if (src != S) std::memcpy(S, src, head_size * sizeof(float));
  }
  // Segments end at the next multiple of kC of the absolute position. A
  // bf16 state is rounded where a segment hands it on (the chunk boundaries
  // and the end), not within a segment.
  for (int64_t c0 = 0; c0 < p.rows;) {
    const int64_t n = std::min(p.rows - c0, kC - (p.position + c0) % kC);
    RunSegment(p, h, c0, n, S, sc);
    if (bf16) {
      for (int64_t i = 0; i < head_size; ++i) {
        S[i] = Bf16ToFloat(FloatToBf16(S[i]));
      }
    }
    c0 += n;
  }
  if (bf16) {
    uint16_t* dst = static_cast<uint16_t*>(p.state_out) + h * head_size;
    for (int64_t i = 0; i < head_size; ++i) dst[i] = FloatToBf16(S[i]);
  }
}

}  // namespace

void ChunkedGatedDeltaRule(const GatedDeltaRuleParams& p, ThreadPool* pool) {
  CHECK(p.states == nullptr && p.state_out_stride == 0)
      << "chunked delta rule: a single state slot only";
  CHECK_GE(p.position, 0) << "chunked delta rule: negative position";
  const int64_t work = p.rows * p.num_v_heads * p.k_head_dim * p.v_head_dim;
  if (pool == nullptr || work < (1 << 16)) {
    for (int64_t h = 0; h < p.num_v_heads; ++h) RunHead(p, h);
  } else {
    pool->ParallelFor(p.num_v_heads, [&](int64_t h) { RunHead(p, h); });
  }
}

}  // namespace specserve::kernels::cpu
