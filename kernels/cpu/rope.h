// CPU partial rotary embedding, in place (see kernels/rope.h).
#ifndef SPECSERVE_KERNELS_CPU_ROPE_H_
#define SPECSERVE_KERNELS_CPU_ROPE_H_

#include "kernels/rope.h"

namespace specserve::kernels::cpu {

void Rope(const RopeParams& p);

}  // namespace specserve::kernels::cpu

#endif  // SPECSERVE_KERNELS_CPU_ROPE_H_
