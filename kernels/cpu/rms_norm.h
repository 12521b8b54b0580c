// CPU RMSNorm and gated RMSNorm (see kernels/rms_norm.h). The mean of squares
// is accumulated in double in index order; everything else is fp32.
#ifndef SPECSERVE_KERNELS_CPU_RMS_NORM_H_
#define SPECSERVE_KERNELS_CPU_RMS_NORM_H_

#include "kernels/rms_norm.h"

namespace specserve::kernels::cpu {

void RmsNorm(const RmsNormParams& p);
void GatedRmsNorm(const GatedRmsNormParams& p);

}  // namespace specserve::kernels::cpu

#endif  // SPECSERVE_KERNELS_CPU_RMS_NORM_H_
