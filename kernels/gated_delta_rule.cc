#include "kernels/gated_delta_rule.h"

#include "kernels/validate.h"

namespace specserve::kernels {

absl::Status Validate(const GatedDeltaRuleParams& p) {
  SS_KERNEL_CHECK(p.rows >= 1 && p.num_k_heads >= 1 && p.num_v_heads >= 1 &&
                      p.k_head_dim >= 1 && p.v_head_dim >= 1,
                  "gated_delta_rule: empty shape");
  SS_KERNEL_CHECK(p.num_v_heads % p.num_k_heads == 0,
                  "gated_delta_rule: nv % nk != 0");
  SS_KERNEL_CHECK(p.q && p.k && p.v && p.a && p.b && p.a_log && p.dt_bias &&
                      (p.states || (p.state_in && p.state_out)) && p.out,
                  "gated_delta_rule: null pointer");
  SS_KERNEL_CHECK(!p.states || p.state_out_stride == 0,
                  "gated_delta_rule: a session batch updates states in place");
  SS_KERNEL_CHECK(p.ab_stride >= p.num_v_heads &&
                      p.out_stride >= p.num_v_heads * p.v_head_dim,
                  "gated_delta_rule: stride too small");
  SS_KERNEL_CHECK(p.state_dtype == DType::kF32 || p.state_dtype == DType::kBF16,
                  "gated_delta_rule: the state is fp32 or bf16");
  const int64_t state_size = p.num_v_heads * p.k_head_dim * p.v_head_dim;
  SS_KERNEL_CHECK(p.state_out_stride == 0 || p.state_out_stride >= state_size,
                  "gated_delta_rule: state_out_stride < state size");
  SS_KERNEL_CHECK(p.state_out_stride == 0 || p.state_in != p.state_out,
                  "gated_delta_rule: snapshots must not overwrite state_in");
  return absl::OkStatus();
}

absl::Status Validate(const GatedDeltaRuleNormParams& p) {
  if (absl::Status s = Validate(p.rule); !s.ok()) return s;
  if (absl::Status s = Validate(p.norm); !s.ok()) return s;
  const GatedDeltaRuleParams& r = p.rule;
  const GatedRmsNormParams& n = p.norm;
  SS_KERNEL_CHECK(
      n.x == r.out && n.y == r.out,
      "gated_delta_rule_normed: the norm runs in place over the rule's output");
  SS_KERNEL_CHECK(n.rows == r.rows * r.num_v_heads && n.dim == r.v_head_dim &&
                      n.x_stride == r.v_head_dim &&
                      r.out_stride == r.num_v_heads * r.v_head_dim,
                  "gated_delta_rule_normed: the norm's vectors are not the "
                  "rule's output heads");
  const Conv1dParams& c = p.conv;
  if (c.rows == 0) return absl::OkStatus();
  if (absl::Status s = Validate(c); !s.ok()) return s;
  const int64_t key_dim = r.num_k_heads * r.k_head_dim;
  SS_KERNEL_CHECK(c.rows == r.rows && c.silu && c.y == r.q &&
                      r.k == r.q + key_dim && r.v == r.q + 2 * key_dim &&
                      c.y_stride == r.qkv_stride &&
                      c.channels == 2 * key_dim + r.num_v_heads * r.v_head_dim,
                  "gated_delta_rule_normed: the conv's outputs are not the "
                  "rule's q, k and v");
  SS_KERNEL_CHECK((c.states != nullptr) == (r.states != nullptr),
                  "gated_delta_rule_normed: a session batch needs both the "
                  "conv and the rule "
                  "states");
  return absl::OkStatus();
}

}  // namespace specserve::kernels
