// Embedding lookup: out[t] = fp32(table[ids[t]]). `ids` live in backend
// memory; every id must be in [0, vocab) (the caller validates token ids
// before they reach the backend; the CPU backend also checks).
#ifndef SPECSERVE_KERNELS_EMBED_H_
#define SPECSERVE_KERNELS_EMBED_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/types.h"

namespace specserve::kernels {

struct EmbedParams {
  int64_t rows = 0;
  const int32_t* ids = nullptr;  // [rows]
  DType table_dtype = DType::kF32;
  WeightLayout table_layout = WeightLayout::kRowMajor;  // the Weight's
  const void* table = nullptr;  // [vocab][dim] in table_layout
  int64_t vocab = 0;
  int64_t dim = 0;
  float* out = nullptr;
  int64_t out_stride = 0;
};

absl::Status Validate(const EmbedParams& p);

}  // namespace specserve::kernels

#endif  // SPECSERVE_KERNELS_EMBED_H_
