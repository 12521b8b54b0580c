#include "kernels/cpu/swiglu.h"

#include "kernels/cpu/elementwise.h"

namespace specserve::kernels::cpu {

void Swiglu(const SwigluParams& p) {
  for (int64_t t = 0; t < p.rows; ++t) {
    const float* g = p.gate + t * p.gate_stride;
    const float* u = p.up + t * p.up_stride;
    float* o = p.out + t * p.out_stride;
    for (int64_t i = 0; i < p.dim; ++i) o[i] = Silu(g[i]) * u[i];
  }
}

}  // namespace specserve::kernels::cpu
