// Where the pieces of a shareable buffer end (Backend::AllocateShareable):
// the one layout rule a sharing backend and its test double both follow.
#ifndef SPECSERVE_KERNELS_SHARE_POINTS_H_
#define SPECSERVE_KERNELS_SHARE_POINTS_H_

#include <algorithm>
#include <cstddef>
#include <vector>

#include "absl/types/span.h"

namespace specserve::kernels {

// The ends, ascending, of the pieces of bytes [from, total) (`from` a page
// multiple): a piece ends at each share point rounded down to a page inside
// (from, total), then at every page after the last of those, and the last
// piece at `total`. A fork shares whole pieces only.
inline std::vector<size_t> SharePieceEnds(size_t from, size_t total,
                                          size_t page,
                                          absl::Span<const size_t> points) {
  std::vector<size_t> ends;
  for (size_t p : points) {
    const size_t at = p / page * page;
    if (at > from && at < total) ends.push_back(at);
  }
  std::sort(ends.begin(), ends.end());
  ends.erase(std::unique(ends.begin(), ends.end()), ends.end());
  for (size_t at = (ends.empty() ? from : ends.back()) + page; at < total;
       at += page) {
    ends.push_back(at);
  }
  if (total > from) ends.push_back(total);
  return ends;
}

}  // namespace specserve::kernels

#endif  // SPECSERVE_KERNELS_SHARE_POINTS_H_
