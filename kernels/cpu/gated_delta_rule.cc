#include "kernels/cpu/gated_delta_rule.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/elementwise.h"

namespace specserve::kernels::cpu {

void L2Normalize(const float* x, int64_t n, float scale, float* out) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss + 1e-6f);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * inv) * scale;
}

namespace {

void RunHead(const GatedDeltaRuleParams& p, int64_t h) {
  const int64_t dk = p.k_head_dim, dv = p.v_head_dim;
  const int64_t kh = h / (p.num_v_heads / p.num_k_heads);
  const int64_t head_size = dk * dv;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  const float a_coef = -std::exp(p.a_log[h]);
  thread_local std::vector<float> buf;
  buf.resize(2 * dk + 2 * dv);
  float* qn = buf.data();
  float* kn = qn + dk;
  float* u = kn + dk;
  float* o = u + dv;
  for (int64_t t = 0; t < p.rows; ++t) {
    const float* src =
        (t == 0 ? p.state_in : p.state_out + (t - 1) * p.state_out_stride) +
        h * head_size;
    float* dst = p.state_out + t * p.state_out_stride + h * head_size;
    L2Normalize(p.q + t * p.qkv_stride + kh * dk, dk, q_scale, qn);
    L2Normalize(p.k + t * p.qkv_stride + kh * dk, dk, 1.0f, kn);
    const float* v = p.v + t * p.qkv_stride + h * dv;
    const float beta = Sigmoid(p.b[t * p.ab_stride + h]);
    const float g = a_coef * Softplus(p.a[t * p.ab_stride + h] + p.dt_bias[h]);
    const float decay = std::exp(g);
    // S ← exp(g)·S and u = Sᵀk̂ in one pass.
    for (int64_t j = 0; j < dv; ++j) u[j] = 0.0f;
    for (int64_t i = 0; i < dk; ++i) {
      const float* s = src + i * dv;
      float* d = dst + i * dv;
      const float ki = kn[i];
      for (int64_t j = 0; j < dv; ++j) {
        const float sd = s[j] * decay;
        d[j] = sd;
        u[j] += sd * ki;
      }
    }
    // delta = β(v − u), reusing u.
    for (int64_t j = 0; j < dv; ++j) u[j] = (v[j] - u[j]) * beta;
    // S ← S + k̂·deltaᵀ and o = Sᵀq̂ in one pass.
    for (int64_t j = 0; j < dv; ++j) o[j] = 0.0f;
    for (int64_t i = 0; i < dk; ++i) {
      float* d = dst + i * dv;
      const float ki = kn[i];
      const float qi = qn[i];
      for (int64_t j = 0; j < dv; ++j) {
        const float sn = d[j] + ki * u[j];
        d[j] = sn;
        o[j] += sn * qi;
      }
    }
    float* out = p.out + t * p.out_stride + h * dv;
    for (int64_t j = 0; j < dv; ++j) out[j] = o[j];
  }
}

}  // namespace

void GatedDeltaRule(const GatedDeltaRuleParams& p, ThreadPool* pool) {
  const int64_t work = p.rows * p.num_v_heads * p.k_head_dim * p.v_head_dim;
  if (pool == nullptr || work < (1 << 16)) {
    for (int64_t h = 0; h < p.num_v_heads; ++h) RunHead(p, h);
  } else {
    pool->ParallelFor(p.num_v_heads, [&](int64_t h) { RunHead(p, h); });
  }
}

}  // namespace specserve::kernels::cpu
