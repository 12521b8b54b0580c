// CPU row reductions: argmax, log-sum-exp, softmax (see kernels/reduce.h).
// Sums of exponentials are accumulated in double in index order.
#ifndef SPECSERVE_KERNELS_CPU_REDUCE_H_
#define SPECSERVE_KERNELS_CPU_REDUCE_H_

#include "kernels/reduce.h"

namespace specserve::kernels::cpu {

void Argmax(const ArgmaxParams& p);
void LogSumExp(const LogSumExpParams& p);
void Softmax(const SoftmaxParams& p);

}  // namespace specserve::kernels::cpu

#endif  // SPECSERVE_KERNELS_CPU_REDUCE_H_
