// Naive double-precision references of every backend op, written straight
// from the math in docs/MODEL.md with dense layouts, for the op tests. Inputs
// are the fp32 (or weight-dtype) arrays the ops read; outputs are double.
#ifndef SPECSERVE_KERNELS_REFERENCE_OPS_H_
#define SPECSERVE_KERNELS_REFERENCE_OPS_H_

#include <cstdint>
#include <vector>

#include "kernels/types.h"

namespace specserve::kernels::reference {

double WeightAt(DType dtype, const void* w, int64_t i);

// y[T][out] = init + x[T][in]·W[out][in]ᵀ (init may be empty = zeros).
std::vector<double> Matmul(int64_t rows, int64_t in, int64_t out,
                           const float* x, DType dtype, const void* w,
                           const std::vector<float>& init);

std::vector<double> RmsNorm(int64_t rows, int64_t dim, const float* x,
                            const float* w, bool plus_one, double eps);
std::vector<double> GatedRmsNorm(int64_t rows, int64_t dim, const float* x,
                                 const float* z, const float* w, double eps);

// x dense [rows][heads][head_dim]; row t at position first_position + t.
std::vector<double> Rope(int64_t rows, int64_t heads, int64_t head_dim,
                         int64_t rotary_dim, const float* x,
                         int64_t first_position, double theta);

// q, gate dense [T][nh][hd]; caches [cap][nkv·hd]; out [T][nh·hd].
std::vector<double> Attention(int64_t rows, int64_t nh, int64_t nkv, int64_t hd,
                              const float* q, const float* gate,
                              const float* k_cache, const float* v_cache,
                              int64_t first_position, double scale);

// x dense [T][C]; weight [C][K]; state [C][K−1]. Returns y [T][C] and the
// state after every token [T][C][K−1].
void Conv1d(int64_t rows, int64_t channels, int64_t kernel, const float* x,
            const float* weight, const float* state_in, bool silu,
            std::vector<double>* y, std::vector<double>* states);

// qkv dense [T][2·nk·dk + nv·dv] (q | k | v); a, b [T][nv]; state
// [nv][dk][dv]. Returns out [T][nv·dv] and the state after every token.
void GatedDeltaRule(int64_t rows, int64_t nk, int64_t nv, int64_t dk,
                    int64_t dv, const float* qkv, const float* a,
                    const float* b, const float* a_log, const float* dt_bias,
                    const float* state_in, std::vector<double>* out,
                    std::vector<double>* states);

std::vector<double> Swiglu(int64_t n, const float* gate, const float* up);
std::vector<double> LogSumExp(int64_t rows, int64_t cols, const float* x,
                              double inv_temperature);
std::vector<double> Softmax(int64_t rows, int64_t cols, const float* x,
                            double inv_temperature);

}  // namespace specserve::kernels::reference

#endif  // SPECSERVE_KERNELS_REFERENCE_OPS_H_
