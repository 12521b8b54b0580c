// Backend-independent checks of MaskTokens and of SampleRows over masked
// rows, against their host definitions (kernels/token_mask.h,
// sampling::ChooseToken): the CPU and CUDA op tests run them.
#ifndef SPECSERVE_KERNELS_TOKEN_MASK_CHECK_H_
#define SPECSERVE_KERNELS_TOKEN_MASK_CHECK_H_

#include <cstdint>

#include "kernels/backend.h"

namespace specserve::kernels::testing {

// Masks random rows of [rows][cols] random logits (row stride `stride`,
// some rows left unmasked, masks from nearly empty to nearly full) on `be`
// and checks every row's bits and every masked row's argmax against
// MaskRowAndArgmax, bit for bit. Then draws from the masked rows
// (SampleRows, several configs) and counts the draws that differ from
// ChooseToken on the host copy: returned through *draws / *differ.
void CheckTokenMasks(Backend* be, int64_t rows, int64_t cols, int64_t stride,
                     uint32_t seed, int* draws, int* differ);

}  // namespace specserve::kernels::testing

#endif  // SPECSERVE_KERNELS_TOKEN_MASK_CHECK_H_
