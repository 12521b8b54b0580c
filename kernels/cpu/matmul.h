// CPU matmul (see kernels/matmul.h for the contract). Each output y[t][o] is
// one dot product of x[t] with weight row o in a fixed order: 16 lanes (two
// 8-lane vector accumulators, elements i mod 16), then a scalar tail, then a
// fixed horizontal sum. Every (t, o) runs that same sequence whatever the row
// count, the output block it falls in, or the thread that runs it. Weight
// rows are reused across the T rows of x while in L1.
#ifndef SPECSERVE_KERNELS_CPU_MATMUL_H_
#define SPECSERVE_KERNELS_CPU_MATMUL_H_

#include "kernels/cpu/thread_pool.h"
#include "kernels/matmul.h"

namespace specserve::kernels::cpu {

void Matmul(const MatmulParams& p, ThreadPool* pool);

// Whether the AVX2+FMA+F16C path is used on this machine (else portable C++).
bool MatmulUsesAvx2();

}  // namespace specserve::kernels::cpu

#endif  // SPECSERVE_KERNELS_CPU_MATMUL_H_
