#include "kernels/cpu/attention.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/elementwise.h"

namespace specserve::kernels::cpu {
namespace {

// Element i of cache row r (kv head kvh) as fp32: exact for either dtype.
struct CacheRows {
  const void* base;
  DType dtype;
  int64_t row_stride;

  // Row r's kv head kvh of dimension d into out[d].
  void Load(int64_t r, int64_t kvh, int64_t d, float* out) const {
    const int64_t at = r * row_stride + kvh * d;
    if (dtype == DType::kBF16) {
      const uint16_t* x = static_cast<const uint16_t*>(base) + at;
      for (int64_t i = 0; i < d; ++i) out[i] = Bf16ToFloat(x[i]);
    } else {
      const float* x = static_cast<const float*>(base) + at;
      for (int64_t i = 0; i < d; ++i) out[i] = x[i];
    }
  }
};

void AttendOne(const AttentionParams& p, int64_t t, int64_t h,
               std::vector<float>* scores, std::vector<float>* acc,
               std::vector<float>* row) {
  const int64_t d = p.head_dim;
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t kvh = h / group;
  const int64_t n = p.first_position + t + 1;  // visible cache rows
  const CacheRows keys{p.k_cache, p.kv_dtype, p.kv_row_stride};
  const CacheRows values{p.v_cache, p.kv_dtype, p.kv_row_stride};
  const float* q = p.q + t * p.q_row_stride + h * p.q_head_stride;
  scores->resize(n);
  row->resize(d);
  float* s = scores->data();
  float* k = row->data();
  float max_s = -INFINITY;
  for (int64_t r = 0; r < n; ++r) {
    keys.Load(r, kvh, d, k);
    float dot = 0.0f;
    for (int64_t i = 0; i < d; ++i) dot += q[i] * k[i];
    s[r] = dot * p.scale;
    if (s[r] > max_s) max_s = s[r];
  }
  float sum = 0.0f;
  for (int64_t r = 0; r < n; ++r) {
    s[r] = std::exp(s[r] - max_s);
    sum += s[r];
  }
  acc->assign(d, 0.0f);
  float* a = acc->data();
  float* v = row->data();
  for (int64_t r = 0; r < n; ++r) {
    values.Load(r, kvh, d, v);
    const float w = s[r];
    for (int64_t i = 0; i < d; ++i) a[i] += w * v[i];
  }
  const float inv_sum = 1.0f / sum;
  float* out = p.out + t * p.out_row_stride + h * d;
  if (p.gate != nullptr) {
    const float* g = p.gate + t * p.gate_row_stride + h * p.gate_head_stride;
    for (int64_t i = 0; i < d; ++i) out[i] = (a[i] * inv_sum) * Sigmoid(g[i]);
  } else {
    for (int64_t i = 0; i < d; ++i) out[i] = a[i] * inv_sum;
  }
}

}  // namespace

void Attention(const AttentionParams& p, ThreadPool* pool) {
  const int64_t tasks = p.rows * p.num_heads;
  auto run = [&](int64_t i) {
    thread_local std::vector<float> scores, acc, row;
    AttendOne(p, i / p.num_heads, i % p.num_heads, &scores, &acc, &row);
  };
  const int64_t work = tasks * (p.first_position + p.rows) * p.head_dim;
  if (pool == nullptr || work < (1 << 16)) {
    for (int64_t i = 0; i < tasks; ++i) run(i);
  } else {
    pool->ParallelFor(tasks, run);
  }
}

}  // namespace specserve::kernels::cpu
