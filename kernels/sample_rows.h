// The last step of sampled decoding, as one call: for each of `rows` rows of
// logits in backend memory, the token a sampled request draws. A row is
// filtered as sampling::FilteredProbs defines (temperature, then top-k,
// top-p, min-p; survivors renormalized) and drawn by the inverse CDF at the
// row's uniform (sampling::SampleIndex).
//
// A -inf logit is a masked token (kernels/token_mask.h): it gets no
// probability, as sampling::ChooseToken defines for masked rows; NaN and +inf
// are refused. Backend::SampleRows runs ChooseToken (the filters and draw
// above, on rows without -inf) on a copy of each row: that is the
// definition, and what the CPU backend does. A backend may filter
// and draw on the device (the CUDA backend: cuda/sample_rows.cu), copying back
// only the tokens. Its token is the host's except where the order of a long
// floating-point sum moves a cut or the draw across a boundary (relative
// differences of ~1e-16), and it must be deterministic and row-invariant: a
// row's token does not depend on the other rows of the call.
//
// Synchronous, like CopyToHost: `token` is filled when the call returns.
#ifndef SPECSERVE_KERNELS_SAMPLE_ROWS_H_
#define SPECSERVE_KERNELS_SAMPLE_ROWS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/sampling/sampling.h"

namespace specserve::kernels {

struct SampleRowsParams {
  int64_t rows = 0;
  int64_t cols = 0;          // the vocabulary
  const float* x = nullptr;  // backend memory; row r's logits start at
  int64_t x_stride = 0;      // x + row_index[r] · x_stride
  // Host arrays of `rows` entries:
  const int32_t* row_index = nullptr;                // nullptr: row r is r
  const sampling::SamplingConfig* config = nullptr;  // valid, not greedy
  const float* uniform = nullptr;                    // in [0, 1)
  int32_t* token = nullptr;                          // out
};

// Params over dense logits [.][cols] at x: row r of the call is x's row
// row_index[r] (row_index nullptr: row r) with configs[r]; uniform and
// token are left for the caller to set.
SampleRowsParams DenseSampleRows(int64_t rows, const float* x, int64_t cols,
                                 const int32_t* row_index,
                                 const sampling::SamplingConfig* configs);

// INVALID_ARGUMENT for sizes, null pointers, a negative row index, a greedy
// or invalid config, a uniform outside [0, 1).
absl::Status Validate(const SampleRowsParams& p);

}  // namespace specserve::kernels

#endif  // SPECSERVE_KERNELS_SAMPLE_ROWS_H_
