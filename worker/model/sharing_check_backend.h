// A test backend that shares pages the way a page-mapping backend does, but
// by copying, so that the copy-on-write invariant of Model::Fork can be
// checked anywhere (the CPU in CI, the tiny models on CUDA whose caches are
// smaller than a device page): AllocateSharing copies the source's leading
// whole pieces (as the CUDA backend's blocks: split at the share points,
// single pages past them) and remembers the pair; Unshare forgets the pair's
// pages from
// its start on; CheckShares() fails when a remembered pair's bytes differ,
// which is what a write to a shared page without Unshare would have done to
// the other buffer on a backend that truly shares (kernels/backend.h).
#ifndef SPECSERVE_WORKER_MODEL_SHARING_CHECK_BACKEND_H_
#define SPECSERVE_WORKER_MODEL_SHARING_CHECK_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/forwarding_backend.h"

namespace specserve::model::testing {

class SharingCheckBackend : public kernels::ForwardingBackend {
 public:
  // `page`: the sharing granularity in bytes (need not divide a row).
  SharingCheckBackend(kernels::Backend* inner, size_t page)
      : ForwardingBackend(inner), page_(page) {}

  size_t SharingPageBytes() const override { return page_; }
  absl::StatusOr<kernels::Buffer> AllocateShareable(
      size_t bytes, absl::Span<const size_t> share_points) override;
  absl::StatusOr<kernels::Buffer> AllocateSharing(size_t bytes,
                                                  const kernels::Buffer& src,
                                                  size_t share,
                                                  size_t* shared) override;
  absl::Status Unshare(const kernels::Buffer& buffer, size_t from) override;

  // OK when every pair still shared holds equal bytes in both buffers.
  absl::Status CheckShares();
  // Bytes of all pairs still shared.
  uint64_t SharedBytes() const;
  // AllocateSharing calls that shared something; Unshare calls that ended
  // some sharing.
  int shares() const { return shares_; }
  int unshares() const { return unshares_; }

 protected:
  void Free(void* data) override;

 private:
  struct Pair {
    const void* a = nullptr;  // the source
    const void* b = nullptr;  // the buffer made sharing it
    size_t bytes = 0;         // shared: [0, bytes) of both
  };
  // A handed-out buffer: the inner backend's, and where its pieces end.
  struct Owned {
    kernels::Buffer inner;
    std::vector<size_t> ends;  // ascending (kernels::SharePieceEnds)
  };
  absl::StatusOr<kernels::Buffer> Make(size_t bytes, std::vector<size_t> ends);

  const size_t page_;
  // The inner backend's buffers behind the ones this backend handed out.
  std::map<void*, Owned> owned_;
  std::vector<Pair> pairs_;
  int shares_ = 0, unshares_ = 0;
};

}  // namespace specserve::model::testing

#endif  // SPECSERVE_WORKER_MODEL_SHARING_CHECK_BACKEND_H_
