// Scalar activation functions shared by the CPU ops, written once so that
// every op (and every row) evaluates them with the same instructions.
#ifndef SPECSERVE_KERNELS_CPU_ELEMENTWISE_H_
#define SPECSERVE_KERNELS_CPU_ELEMENTWISE_H_

#include <cmath>

namespace specserve::kernels::cpu {

inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float Silu(float x) { return x / (1.0f + std::exp(-x)); }
// torch.nn.functional.softplus with beta 1, threshold 20.
inline float Softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(x));
}

}  // namespace specserve::kernels::cpu

#endif  // SPECSERVE_KERNELS_CPU_ELEMENTWISE_H_
