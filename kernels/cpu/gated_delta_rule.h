// CPU gated delta rule, per-token recurrent form (see
// kernels/gated_delta_rule.h). Value heads are independent tasks; each runs
// its tokens in order. Per token: u and o are accumulated over the key
// dimension in index order, the state is updated element by element, and
// snapshots are written as the state is updated (no extra pass).
#ifndef SPECSERVE_KERNELS_CPU_GATED_DELTA_RULE_H_
#define SPECSERVE_KERNELS_CPU_GATED_DELTA_RULE_H_

#include "kernels/cpu/thread_pool.h"
#include "kernels/gated_delta_rule.h"

namespace specserve::kernels::cpu {

void GatedDeltaRule(const GatedDeltaRuleParams& p, ThreadPool* pool);

}  // namespace specserve::kernels::cpu

#endif  // SPECSERVE_KERNELS_CPU_GATED_DELTA_RULE_H_
