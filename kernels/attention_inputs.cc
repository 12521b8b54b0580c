#include "kernels/attention_inputs.h"

namespace specserve::kernels {

absl::Status Validate(const AttentionInputsParams& p) {
  for (const RmsNormParams* n : {&p.q_norm, &p.k_norm}) {
    if (absl::Status s = Validate(*n); !s.ok()) return s;
  }
  for (const RopeParams* r : {&p.q_rope, &p.k_rope}) {
    if (absl::Status s = Validate(*r); !s.ok()) return s;
  }
  for (const ScatterRowsParams* c : {&p.k_scatter, &p.v_scatter}) {
    if (absl::Status s = Validate(*c); !s.ok()) return s;
  }
  return absl::OkStatus();
}

AttentionInputsParams AttentionInputsOf(const FusedQkvRows& r) {
  const int64_t hd = r.head_dim, kv = r.kv_heads * hd,
                W = 2 * r.heads * hd + 2 * kv;
  float* const k = r.x + 2 * r.heads * hd;
  AttentionInputsParams p;
  RmsNormParams& qn = p.q_norm;
  qn.rows = r.rows * r.heads;
  qn.dim = hd;
  qn.x = qn.y = r.x;
  qn.x_stride = qn.y_stride = 2 * hd;
  qn.group = r.heads;
  qn.x_group_stride = qn.y_group_stride = W;
  qn.weight = r.q_norm;
  qn.eps = r.eps;
  RmsNormParams& kn = p.k_norm;
  kn = qn;
  kn.rows = r.rows * r.kv_heads;
  kn.x = kn.y = k;
  kn.x_stride = kn.y_stride = hd;
  kn.group = r.kv_heads;
  kn.weight = r.k_norm;
  RopeParams& rq = p.q_rope;
  rq.rows = r.rows;
  rq.heads = r.heads;
  rq.head_dim = hd;
  rq.rotary_dim = r.rotary_dim;
  rq.x = r.x;
  rq.row_stride = W;
  rq.head_stride = 2 * hd;
  rq.inv_freq = r.inv_freq;
  RopeParams& rk = p.k_rope;
  rk = rq;
  rk.heads = r.kv_heads;
  rk.x = k;
  rk.head_stride = hd;
  ScatterRowsParams& sk = p.k_scatter;
  sk.rows = r.rows;
  sk.cols = kv;
  sk.src = k;
  sk.src_stride = W;
  sk.dst_row_stride = kv;
  p.v_scatter = sk;
  p.v_scatter.src = k + kv;
  return p;
}

}  // namespace specserve::kernels
