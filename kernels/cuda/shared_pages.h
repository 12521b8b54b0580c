// Device buffers built from CUDA virtual-memory pages (cuMemCreate /
// cuMemMap), so that one page can back two buffers: the CUDA backend's
// AllocateShareable / AllocateSharing / Unshare (kernels/backend.h), with
// which a forked session's attention rows below the fork are its source's
// memory (docs/DESIGN.md "Prefix reuse"). Kernels see ordinary device
// pointers; only the mapping behind an address changes.
//
// A buffer is a reserved address range of whole pages, mapped from physical
// blocks of one or more pages (one cuMemCreate each: the driver maps a block
// only whole, from its start). A block shared by two buffers is mapped in
// both; it is freed when the last mapping goes. A block with one user is the
// buffer's own memory. Sharing is by whole blocks, and what the driver
// charges follows the mappings (shared_pages_test prints it: a fork of 32
// buffers of 8 single pages costs ~4x its calls with one 8-page block a
// buffer), so Allocate takes the offsets where forks are expected (a
// prompt's end, its prefix checkpoints) and makes one block between two of
// them; past the last, single pages (any page may end a later fork there).
//
// Thread-safe. The driver entry points come through the runtime
// (cudaGetDriverEntryPointByVersion), so nothing links libcuda.
#ifndef SPECSERVE_KERNELS_CUDA_SHARED_PAGES_H_
#define SPECSERVE_KERNELS_CUDA_SHARED_PAGES_H_

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace specserve::kernels::cuda {

class SharedPages {
 public:
  // UNIMPLEMENTED when the device or driver has no virtual memory
  // management (the backend then shares nothing).
  static absl::StatusOr<std::unique_ptr<SharedPages>> Create(int device);
  // Waits for every pending release and frees every range.
  ~SharedPages();

  // The page: the granularity of sharing (2 MiB on Hopper).
  size_t page() const { return page_; }
  // Whether a buffer of `bytes` is worth building from pages: the rounding
  // to whole pages wastes at most an eighth of it.
  bool Worthwhile(size_t bytes) const;

  // A zero-filled range of `bytes` (rounded up to pages) whose blocks end at
  // `cuts` (byte offsets, rounded down to pages; see above); the zeroing is
  // enqueued on `stream`. RESOURCE_EXHAUSTED when the device is full.
  absl::StatusOr<void*> Allocate(size_t bytes, absl::Span<const size_t> cuts,
                                 cudaStream_t stream);
  // A range of `bytes` whose leading blocks are those of range `src` that
  // lie wholly within its first `share` bytes; the rest is single pages,
  // zero-filled as above. *shared gets the bytes shared (0 and a plain
  // Allocate when `src` is not a range of this object).
  absl::StatusOr<void*> AllocateSharing(size_t bytes, const void* src,
                                        size_t share, size_t* shared,
                                        cudaStream_t stream);
  bool Owns(const void* p) const;
  // Gives range `p` blocks of its own, with the same contents, from the
  // block holding byte `from` on, wherever another range shares them. Waits
  // for `stream` (the old blocks may be in use) before remapping.
  absl::Status Unshare(const void* p, size_t from, cudaStream_t stream);
  // Frees range `p` once the work enqueued on `stream` so far has finished.
  // A range with no shared pages is kept for the next Allocate of its size.
  void Release(void* p, cudaStream_t stream);
  // Frees the kept ranges (to make room for the runtime's own allocator).
  void Trim();

 private:
  struct Driver {
    decltype(&cuMemCreate) create = nullptr;
    decltype(&cuMemRelease) release = nullptr;
    decltype(&cuMemAddressReserve) reserve = nullptr;
    decltype(&cuMemAddressFree) address_free = nullptr;
    decltype(&cuMemMap) map = nullptr;
    decltype(&cuMemUnmap) unmap = nullptr;
    decltype(&cuMemSetAccess) set_access = nullptr;
    decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  };
  // One cuMemCreate; released when the last segment using it goes.
  struct Block {
    const Driver* driver = nullptr;
    CUmemGenericAllocationHandle handle = 0;
    ~Block();
  };
  // A block mapped whole at `offset` of its range.
  struct Segment {
    size_t offset = 0;
    size_t bytes = 0;
    std::shared_ptr<Block> block;
  };
  struct Range {
    size_t bytes = 0;               // reserved: whole pages
    std::vector<Segment> segments;  // in order, covering [0, bytes)
  };
  // A kept range's key: its bytes and its blocks' sizes.
  using Layout = std::pair<size_t, std::vector<size_t>>;
  struct PendingRelease {
    uintptr_t base = 0;
    cudaEvent_t done = nullptr;
  };

  SharedPages(int device, Driver driver, size_t page);
  size_t RoundUp(size_t bytes) const;
  // The blocks' sizes of a fresh range of `total` bytes from `from` on:
  // blocks ending at `cuts`, then single pages.
  std::vector<size_t> BlockSizes(size_t from, size_t total,
                                 absl::Span<const size_t> cuts) const;
  static Layout LayoutOf(const Range& r);
  absl::StatusOr<std::shared_ptr<Block>> NewBlock(size_t bytes);
  absl::StatusOr<uintptr_t> Reserve(size_t bytes);
  // Maps `block` (all of its `bytes`) at address `at`.
  absl::Status MapAt(uintptr_t at, size_t bytes, const Block& block);
  // Lets the device read and write [at, at + bytes), every page mapped.
  absl::Status Grant(uintptr_t at, size_t bytes);
  // Unmaps every block of `r` at `base` and frees its addresses.
  void Destroy(uintptr_t base, Range& r);
  // A new range of `bytes`: the segments `borrowed` first (at their
  // offsets), then fresh blocks ending at `cuts`, then single pages
  // (zero-filled on `stream`).
  absl::StatusOr<uintptr_t> Build(size_t bytes,
                                  const std::vector<Segment>& borrowed,
                                  absl::Span<const size_t> cuts,
                                  cudaStream_t stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finishes the releases whose work is done (all of them with `wait`).
  void ReapLocked(bool wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TrimLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int device_;
  const Driver driver_;
  const size_t page_;
  mutable absl::Mutex mu_;
  std::map<uintptr_t, Range> ranges_ ABSL_GUARDED_BY(mu_);
  std::vector<PendingRelease> pending_ ABSL_GUARDED_BY(mu_);
  // Released ranges of their own memory only, by layout, for reuse.
  std::multimap<Layout, uintptr_t> kept_ ABSL_GUARDED_BY(mu_);
};

}  // namespace specserve::kernels::cuda

#endif  // SPECSERVE_KERNELS_CUDA_SHARED_PAGES_H_
