// CPU causal depthwise conv with state snapshots (see kernels/conv1d.h).
// Per channel the K products are summed in kernel order, oldest input first.
#ifndef SPECSERVE_KERNELS_CPU_CONV1D_H_
#define SPECSERVE_KERNELS_CPU_CONV1D_H_

#include "kernels/conv1d.h"

namespace specserve::kernels::cpu {

void Conv1d(const Conv1dParams& p);

}  // namespace specserve::kernels::cpu

#endif  // SPECSERVE_KERNELS_CPU_CONV1D_H_
