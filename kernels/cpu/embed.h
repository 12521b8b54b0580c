// CPU embedding lookup with exact widening to fp32 (see kernels/embed.h).
#ifndef SPECSERVE_KERNELS_CPU_EMBED_H_
#define SPECSERVE_KERNELS_CPU_EMBED_H_

#include "absl/status/status.h"
#include "kernels/embed.h"

namespace specserve::kernels::cpu {

// OUT_OF_RANGE naming the id when an id is outside [0, vocab).
absl::Status Embed(const EmbedParams& p);

}  // namespace specserve::kernels::cpu

#endif  // SPECSERVE_KERNELS_CPU_EMBED_H_
