// The allowed-token mask of constrained decoding (structured output), on the
// device: for each listed row of logits in backend memory, every token whose
// bit is clear gets -inf in place, and the row's argmax (the first index of
// the maximum, as Argmax) is taken over what is left. A draw from the same
// logits afterwards (SampleRows) therefore picks among the allowed tokens
// only, and the host never needs the [V] row: only `rows` x `words` mask
// words travel, host to device.
//
// Bit b of word w allows token 32·w + b (xgrammar's bitmask layout). The
// argmax is written for the masked rows only; the other entries of `argmax`
// are untouched. Rows are independent: a row's result does not depend on
// the other rows of the call.
#ifndef SPECSERVE_KERNELS_TOKEN_MASK_H_
#define SPECSERVE_KERNELS_TOKEN_MASK_H_

#include <cstdint>

#include "absl/status/status.h"

namespace specserve::kernels {

// Mask words covering `cols` tokens.
constexpr int64_t TokenMaskWords(int64_t cols) { return (cols + 31) / 32; }

struct TokenMaskParams {
  int64_t rows = 0;      // masked rows
  int64_t cols = 0;      // the vocabulary
  float* x = nullptr;    // backend memory; row r of the call is at
  int64_t x_stride = 0;  // x + row_index[r] · x_stride
  // Host arrays: row_index [rows], allowed [rows][TokenMaskWords(cols)].
  const int32_t* row_index = nullptr;
  const uint32_t* allowed = nullptr;
  // Backend memory: argmax[row_index[r]] receives row r's masked argmax.
  int32_t* argmax = nullptr;
};

// INVALID_ARGUMENT for sizes, null pointers, a negative row index or one
// listed twice.
absl::Status Validate(const TokenMaskParams& p);

// The masked argmax of one host row (what every backend must return):
// the first index of the maximum over the allowed tokens, the others set to
// -inf in `row`.
int32_t MaskRowAndArgmax(float* row, int64_t cols, const uint32_t* allowed);

}  // namespace specserve::kernels

#endif  // SPECSERVE_KERNELS_TOKEN_MASK_H_
