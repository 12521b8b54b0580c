#include "kernels/cpu/embed.h"

#include "absl/strings/str_cat.h"
#include "kernels/cpu/convert.h"

namespace specserve::kernels::cpu {

absl::Status Embed(const EmbedParams& p) {
  for (int64_t t = 0; t < p.rows; ++t) {
    const int32_t id = p.ids[t];
    if (id < 0 || id >= p.vocab) {
      return absl::OutOfRangeError(
          absl::StrCat("embed: token id ", id, " outside [0, ", p.vocab, ")"));
    }
  }
  const size_t row_bytes =
      static_cast<size_t>(p.dim) * DTypeSize(p.table_dtype);
  for (int64_t t = 0; t < p.rows; ++t) {
    const char* row = static_cast<const char*>(p.table) + p.ids[t] * row_bytes;
    ConvertRow(p.table_dtype, row, p.dim, p.out + t * p.out_stride);
  }
  return absl::OkStatus();
}

}  // namespace specserve::kernels::cpu
