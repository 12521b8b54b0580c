#include "kernels/cpu/gated_delta_rule.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/elementwise.h"

namespace specserve::kernels::cpu {

void L2Normalize(const float* x, int64_t n, float scale, float* out) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss + 1e-6f);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * inv) * scale;
}

namespace {

// One token of head h: S (the state before it, [dk][dv] fp32) to the state
// after it in `dst` (dst == S in place), its output into out[dv].
void Token(const GatedDeltaRuleParams& p, int64_t h, int64_t t,
           const float* src, float* dst, float* buf, float* out) {
  const int64_t dk = p.k_head_dim, dv = p.v_head_dim;
  const int64_t kh = h / (p.num_v_heads / p.num_k_heads);
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  const float a_coef = -std::exp(p.a_log[h]);
  float* qn = buf;
  float* kn = qn + dk;
  float* u = kn + dk;
  float* o = u + dv;
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
  for (int64_t j = 0; j < dv; ++j) out[j] = o[j];
}

// fp32 storage: each token reads the previous token's snapshot (or
// state_in) and writes its own, as the state is updated.
void RunHeadF32(const GatedDeltaRuleParams& p, int64_t h, float* buf) {
  const int64_t dv = p.v_head_dim;
  const int64_t head_size = p.k_head_dim * dv;
  const float* in = static_cast<const float*>(p.state_in);
  float* so = static_cast<float*>(p.state_out);
  for (int64_t t = 0; t < p.rows; ++t) {
    const float* src =
        (t == 0 ? in : so + (t - 1) * p.state_out_stride) + h * head_size;
    float* dst = so + t * p.state_out_stride + h * head_size;
    Token(p, h, t, src, dst, buf, p.out + t * p.out_stride + h * dv);
  }
}

// bf16 storage: the head's state widened into fp32 `work`, each token's
// update in place there, then rounded to bf16 (kept widened in `work` for
// the next token, stored as a snapshot or at the end), as CUDA does.
void RunHeadBf16(const GatedDeltaRuleParams& p, int64_t h, float* buf,
                 float* work) {
  const int64_t dv = p.v_head_dim;
  const int64_t head_size = p.k_head_dim * dv;
  const uint16_t* in = static_cast<const uint16_t*>(p.state_in) + h * head_size;
  uint16_t* so = static_cast<uint16_t*>(p.state_out) + h * head_size;
  for (int64_t i = 0; i < head_size; ++i) work[i] = Bf16ToFloat(in[i]);
  for (int64_t t = 0; t < p.rows; ++t) {
    Token(p, h, t, work, work, buf, p.out + t * p.out_stride + h * dv);
    const bool store = p.state_out_stride != 0 || t == p.rows - 1;
    uint16_t* dst = so + t * p.state_out_stride;
    for (int64_t i = 0; i < head_size; ++i) {
      const uint16_t r = FloatToBf16(work[i]);
      work[i] = Bf16ToFloat(r);
      if (store) dst[i] = r;
    }
  }
}

void RunHead(const GatedDeltaRuleParams& p, int64_t h) {
  thread_local std::vector<float> buf, work;
  buf.resize(2 * p.k_head_dim + 2 * p.v_head_dim);
  if (p.state_dtype == DType::kBF16) {
    work.resize(p.k_head_dim * p.v_head_dim);
    RunHeadBf16(p, h, buf.data(), work.data());
  } else {
    RunHeadF32(p, h, buf.data());
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
