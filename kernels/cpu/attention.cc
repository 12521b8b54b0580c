#include "kernels/cpu/attention.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/elementwise.h"

namespace specserve::kernels::cpu {
namespace {

void AttendOne(const AttentionParams& p, int64_t t, int64_t h,
               std::vector<float>* scores, std::vector<float>* acc) {
  const int64_t d = p.head_dim;
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t kvh = h / group;
  const int64_t n = p.first_position + t + 1;  // visible cache rows
  const float* q = p.q + t * p.q_row_stride + h * p.q_head_stride;
  scores->resize(n);
  float* s = scores->data();
  float max_s = -INFINITY;
  for (int64_t r = 0; r < n; ++r) {
    const float* k = p.k_cache + r * p.kv_row_stride + kvh * d;
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
  for (int64_t r = 0; r < n; ++r) {
    const float* v = p.v_cache + r * p.kv_row_stride + kvh * d;
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
    thread_local std::vector<float> scores, acc;
    AttendOne(p, i / p.num_heads, i % p.num_heads, &scores, &acc);
  };
  const int64_t work = tasks * (p.first_position + p.rows) * p.head_dim;
  if (pool == nullptr || work < (1 << 16)) {
    for (int64_t i = 0; i < tasks; ++i) run(i);
  } else {
    pool->ParallelFor(tasks, run);
  }
}

}  // namespace specserve::kernels::cpu
