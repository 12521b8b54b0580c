#include "kernels/cpu/simd.h"

namespace specserve::kernels::cpu {

bool HasAvx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  }();
  return has;
}

}  // namespace specserve::kernels::cpu
