// CPU SwiGLU activation: out = silu(gate) ⊙ up (see kernels/swiglu.h).
#ifndef SPECSERVE_KERNELS_CPU_SWIGLU_H_
#define SPECSERVE_KERNELS_CPU_SWIGLU_H_

#include "kernels/swiglu.h"

namespace specserve::kernels::cpu {

void Swiglu(const SwigluParams& p);

}  // namespace specserve::kernels::cpu

#endif  // SPECSERVE_KERNELS_CPU_SWIGLU_H_
