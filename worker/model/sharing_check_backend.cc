#include "worker/model/sharing_check_backend.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/share_points.h"
#include "telemetry/status_macros.h"

namespace specserve::model::testing {

using kernels::Buffer;

absl::StatusOr<Buffer> SharingCheckBackend::Make(size_t bytes,
                                                 std::vector<size_t> ends) {
  SS_ASSIGN_OR_RETURN(Buffer inner, inner()->Allocate(bytes));
  void* p = inner.data();
  owned_.emplace(p, Owned{std::move(inner), std::move(ends)});
  return Buffer(this, p, bytes);
}

absl::StatusOr<Buffer> SharingCheckBackend::AllocateShareable(
    size_t bytes, absl::Span<const size_t> share_points) {
  return Make(bytes, kernels::SharePieceEnds(0, bytes, page_, share_points));
}

absl::StatusOr<Buffer> SharingCheckBackend::AllocateSharing(size_t bytes,
                                                            const Buffer& src,
                                                            size_t share,
                                                            size_t* shared) {
  *shared = 0;
  auto it = owned_.find(const_cast<void*>(src.data()));
  if (it == owned_.end()) return AllocateShareable(bytes, {});
  // The source's whole pieces within the first `share` bytes' whole pages.
  const size_t limit = std::min({share, bytes, src.bytes()}) / page_ * page_;
  std::vector<size_t> ends;
  for (size_t end : it->second.ends) {
    if (end > limit) break;
    ends.push_back(end);
  }
  const size_t n = ends.empty() ? 0 : ends.back();
  for (size_t end : kernels::SharePieceEnds(n, bytes, page_, {})) {
    ends.push_back(end);
  }
  SS_ASSIGN_OR_RETURN(Buffer b, Make(bytes, std::move(ends)));
  if (n == 0) return b;
  SS_RETURN_IF_ERROR(inner()->CopyOnDevice(b.data(), src.data(), n));
  pairs_.push_back({src.data(), b.data(), n});
  *shared = n;
  ++shares_;
  return b;
}

absl::Status SharingCheckBackend::Unshare(const Buffer& buffer, size_t from) {
  const size_t start = from / page_ * page_;
  bool ended = false;
  for (Pair& p : pairs_) {
    if ((p.a == buffer.data() || p.b == buffer.data()) && p.bytes > start) {
      p.bytes = start;
      ended = true;
    }
  }
  if (ended) ++unshares_;
  return absl::OkStatus();
}

absl::Status SharingCheckBackend::CheckShares() {
  for (const Pair& p : pairs_) {
    if (p.bytes == 0) continue;
    std::vector<char> a(p.bytes), b(p.bytes);
    SS_RETURN_IF_ERROR(inner()->CopyToHost(a.data(), p.a, p.bytes));
    SS_RETURN_IF_ERROR(inner()->CopyToHost(b.data(), p.b, p.bytes));
    if (std::memcmp(a.data(), b.data(), p.bytes) != 0) {
      size_t i = 0;
      while (a[i] == b[i]) ++i;
      return absl::DataLossError(
          absl::StrCat("a shared page was written without Unshare: byte ", i,
                       " of ", p.bytes, " shared differs"));
    }
  }
  return absl::OkStatus();
}

uint64_t SharingCheckBackend::SharedBytes() const {
  uint64_t n = 0;
  for (const Pair& p : pairs_) n += p.bytes;
  return n;
}

void SharingCheckBackend::Free(void* data) {
  // A freed buffer's pairs end with it: the other side keeps its bytes.
  pairs_.erase(
      std::remove_if(pairs_.begin(), pairs_.end(),
                     [&](const Pair& p) { return p.a == data || p.b == data; }),
      pairs_.end());
  owned_.erase(data);
}

}  // namespace specserve::model::testing
