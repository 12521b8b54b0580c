// CPU gated delta rule, per-token recurrent form (see
// kernels/gated_delta_rule.h). Value heads are independent tasks; each runs
// its tokens in order. Per token: u and o are accumulated over the key
// dimension in index order, the state is updated element by element, and
// snapshots are written as the state is updated (no extra pass).
#ifndef SPECSERVE_KERNELS_CPU_GATED_DELTA_RULE_H_
#define SPECSERVE_KERNELS_CPU_GATED_DELTA_RULE_H_

#include <cstdint>

#include "kernels/cpu/thread_pool.h"
#include "kernels/gated_delta_rule.h"

namespace specserve::kernels::cpu {

void GatedDeltaRule(const GatedDeltaRuleParams& p, ThreadPool* pool);

// q̂ and k̂: x / sqrt(Σx² + 1e-6), times `scale`, into out (fp32; the sum in
// index order). Shared with the chunked form so both see the same q̂, k̂.
void L2Normalize(const float* x, int64_t n, float scale, float* out);

}  // namespace specserve::kernels::cpu

#endif  // SPECSERVE_KERNELS_CPU_GATED_DELTA_RULE_H_
