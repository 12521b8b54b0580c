// CPU gated delta rule, chunked form: the algorithm of the CUDA prefill
// (kernels/cuda/prefill_chunked_delta_rule.cu) and of transformers'
// no-cache forward, for any nk, nv, dk, dv. CpuBackend runs it as its
// PrefillGatedDeltaRule when CpuBackendOptions::chunked_prefill is set, so
// the chunked algorithm has an fp32 oracle and HF parity of its own
// (worker/model/hf_parity_test). Same inputs, gates and normalisations as
// the per-token rule (kernels/gated_delta_rule.h); the same function of
// them up to rounding.
//
// Algorithm. Tokens go in chunks of C = kPrefillDeltaRuleChunk at absolute
// positions (position + t): a chunk boundary is every multiple of C, and a
// call starting or ending inside a chunk takes the part of it that it
// holds as one segment. Per value head, with S0 the state [dk][dv] before
// a segment [c0, c1) and t, s indices in it:
//   G_t = Σ_{s<=t} g_s (the cumulative log decay; every e^(G_t−G_s) with
//   s <= t is <= 1),
//   A[t][s] = β_t·e^(G_t−G_s)·(k̂_t·k̂_s) for s < t (strictly lower),
//   T = (I + A)⁻¹ by forward substitution (never formed):
//     w_t = β_t·e^(G_t)·k̂_t − Σ_{s<t} A[t][s]·w_s,
//     u_t = β_t·v_t − Σ_{s<t} A[t][s]·u_s,
//   v_new_t = u_t − S0ᵀw_t (the token's update β(v − u) of the per-token
//   form),
//   o_t = e^(G_t)·S0ᵀq̂_t + Σ_{s<=t} e^(G_t−G_s)·(q̂_t·k̂_s)·v_new_s,
//   S ← e^(G_last)·S0 + Σ_s e^(G_last−G_s)·k̂_s·v_new_sᵀ.
// (transformers forms T and applies it; the CUDA kernel solves
// (I + A)·v_new_t = β_t·(v_t − e^(G_t)·S0ᵀk̂_t) without w and u: by
// linearity the same v_new.)
//
// Precision: fp32 throughout, every sum accumulated in fp32 in a fixed
// index order. fp32 because this form exists to show the chunked
// algorithm's own fp32 behaviour, the one transformers' torch path (fp32
// matmuls) and the CUDA kernel (fp32 accumulators) have; wider sums would
// hide that rounding and make this oracle differ from both. The measured
// distance to the per-token rule is in chunked_delta_rule_test.
//
// Determinism and row invariance: token t's output depends only on S0 and
// the tokens of its segment up to t; the state after a segment on all of
// its tokens. So a prompt split into calls at multiples of C (absolute
// positions) gives one call's bits, and a split elsewhere agrees within
// tolerance. Value heads are independent tasks on the pool; the thread
// count never changes a bit.
#ifndef SPECSERVE_KERNELS_CPU_CHUNKED_DELTA_RULE_H_
#define SPECSERVE_KERNELS_CPU_CHUNKED_DELTA_RULE_H_

#include "kernels/cpu/thread_pool.h"
#include "kernels/gated_delta_rule.h"

namespace specserve::kernels::cpu {

// One session's p.rows tokens: p valid (Validate), a single state slot
// (states == nullptr, state_out_stride == 0; state_out == state_in for in
// place, else they do not overlap), position >= 0, and out overlapping none
// of the inputs. CHECK-fails otherwise (the backend checks first).
void ChunkedGatedDeltaRule(const GatedDeltaRuleParams& p, ThreadPool* pool);

}  // namespace specserve::kernels::cpu

#endif  // SPECSERVE_KERNELS_CPU_CHUNKED_DELTA_RULE_H_
