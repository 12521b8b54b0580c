// The gated delta rule, per-token recurrent form (docs/MODEL.md "Gated
// DeltaNet" steps 4–5), fused with its gates. Per token t and value head h
// (key head h / (nv/nk)):
//   β = sigmoid(b[h]);  g = −exp(A_log[h])·softplus(a[h] + dt_bias[h])
//   q̂ = q·rsqrt(Σq²+1e-6)·dk^(−1/2);  k̂ = k·rsqrt(Σk²+1e-6)
//   S ← exp(g)·S;  u = Sᵀk̂;  S ← S + k̂·(β·(v − u))ᵀ;  o = Sᵀq̂
// S is [nv][dk][dv] of state_dtype. Snapshot semantics as in conv1d.h: the
// state after token t goes to state_out + t·state_out_stride (0 = single slot,
// in place when state_out == state_in). Each token's arithmetic is the same
// whatever T is and whichever mode: verify column j equals decode at that
// position. Session batch (states != nullptr): as in conv1d.h, row t updates
// its own session's state states[t] in place (state_in/state_out unused).
//
// State storage (state_dtype): fp32, or bf16 (half the bytes). The state
// between two tokens is always a value of the storage type: each token's
// update runs in fp32 from the stored state widened exactly, its output o
// is computed from that fp32 update as with fp32 storage, and the updated
// state is rounded to nearest even (NaN to 0x7fff) before the next token
// reads it, whether it goes to memory or stays in registers. So a T-token
// call equals T one-token calls bit for bit in either type, and with fp32
// storage the rounding is the identity. The chunked prefill form rounds
// only the state it carries between chunks (within its tolerance).
#ifndef SPECSERVE_KERNELS_GATED_DELTA_RULE_H_
#define SPECSERVE_KERNELS_GATED_DELTA_RULE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/conv1d.h"
#include "kernels/rms_norm.h"
#include "kernels/types.h"

namespace specserve::kernels {

struct GatedDeltaRuleParams {
  int64_t rows = 0;          // T
  int64_t num_k_heads = 0;   // nk
  int64_t num_v_heads = 0;   // nv, multiple of nk
  int64_t k_head_dim = 0;    // dk
  int64_t v_head_dim = 0;    // dv
  const float* q = nullptr;  // [T][qkv_stride], head i at i·dk
  const float* k = nullptr;  // [T][qkv_stride], head i at i·dk
  const float* v = nullptr;  // [T][qkv_stride], head h at h·dv
  int64_t qkv_stride = 0;
  const float* a = nullptr;  // [T][ab_stride] (nv), pre-softplus
  const float* b = nullptr;  // [T][ab_stride] (nv), pre-sigmoid
  int64_t ab_stride = 0;
  const float* a_log = nullptr;    // [nv] fp32
  const float* dt_bias = nullptr;  // [nv] fp32
  const void* state_in = nullptr;  // [nv][dk][dv] state_dtype
  void* state_out = nullptr;
  int64_t state_out_stride = 0;     // elements; 0 = single slot
  DType state_dtype = DType::kF32;  // kF32 or kBF16
  float* out = nullptr;             // [T][out_stride], head h at h·dv
  int64_t out_stride = 0;
  void* const* states = nullptr;  // session batch: [rows] state pointers
  // Absolute position of row 0 in its sequence (single slot). Only the
  // chunked prefill form reads it: it groups tokens into chunks of
  // kPrefillDeltaRuleChunk at multiples of it, so a prompt split into calls
  // at such multiples gives one call's bits.
  int64_t position = 0;
};

// The chunk of the chunked prefill form (Backend::PrefillGatedDeltaRule on
// CUDA): callers that split a prompt into passes cut at multiples of it.
inline constexpr int64_t kPrefillDeltaRuleChunk = 64;

absl::Status Validate(const GatedDeltaRuleParams& p);

// The linear-attention core of a GDN block: optionally the short conv
// (docs/MODEL.md step 2) when conv.rows > 0, the rule, then the gated RmsNorm
// of every output head (docs/MODEL.md step 6) in place over the rule's output:
// norm.x == norm.y == rule.out, one vector per (token, value head),
// norm.rows == rule.rows · nv, norm.dim == dv, norm.x_stride == dv and
// rule.out_stride == nv · dv. The conv's outputs are the rule's q, k and v:
// conv.y == rule.q, rule.k == rule.q + nk·dk, rule.v == rule.q + 2·nk·dk,
// conv.y_stride == rule.qkv_stride, conv.channels == 2·nk·dk + nv·dv, with
// silu, and a session batch's conv states beside its rule states. The
// result is that of the ops in turn, bit for bit, conv outputs and states
// included (Backend::GatedDeltaRuleNormed).
struct GatedDeltaRuleNormParams {
  GatedDeltaRuleParams rule;
  GatedRmsNormParams norm;
  Conv1dParams conv;  // rows == 0: no conv (q, k, v are given)
};

absl::Status Validate(const GatedDeltaRuleNormParams& p);

}  // namespace specserve::kernels

#endif  // SPECSERVE_KERNELS_GATED_DELTA_RULE_H_
