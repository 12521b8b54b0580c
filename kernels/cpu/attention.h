// CPU causal attention over the KV cache (see kernels/attention.h). Each
// (row, head) pair is one task: scores in fp32 (dot products in index order),
// softmax with the row maximum subtracted, the value sum accumulated in cache
// row order and divided by the normalizer at the end, then the gate.
#ifndef SPECSERVE_KERNELS_CPU_ATTENTION_H_
#define SPECSERVE_KERNELS_CPU_ATTENTION_H_

#include "kernels/attention.h"
#include "kernels/cpu/thread_pool.h"

namespace specserve::kernels::cpu {

void Attention(const AttentionParams& p, ThreadPool* pool);

}  // namespace specserve::kernels::cpu

#endif  // SPECSERVE_KERNELS_CPU_ATTENTION_H_
