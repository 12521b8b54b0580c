#include "kernels/cuda/shared_pages.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/share_points.h"
#include "telemetry/status_macros.h"

namespace specserve::kernels::cuda {
namespace {

absl::Status DriverStatus(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return absl::OkStatus();
  const std::string msg = absl::StrCat("cuda: ", what, ": CUresult ", r);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

template <typename F>
absl::Status Load(const char* name, F* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err = cudaGetDriverEntryPointByVersion(
      name, &p, 12000, cudaEnableDefault, &found);
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess ||
      p == nullptr) {
    cudaGetLastError();
    return absl::UnimplementedError(
        absl::StrCat("cuda: the driver has no ", name));
  }
  *fn = reinterpret_cast<F>(p);
  return absl::OkStatus();
}

CUmemAllocationProp DeviceProp(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedPages>> SharedPages::Create(int device) {
  Driver d;
  SS_RETURN_IF_ERROR(Load("cuMemCreate", &d.create));
  SS_RETURN_IF_ERROR(Load("cuMemRelease", &d.release));
  SS_RETURN_IF_ERROR(Load("cuMemAddressReserve", &d.reserve));
  SS_RETURN_IF_ERROR(Load("cuMemAddressFree", &d.address_free));
  SS_RETURN_IF_ERROR(Load("cuMemMap", &d.map));
  SS_RETURN_IF_ERROR(Load("cuMemUnmap", &d.unmap));
  SS_RETURN_IF_ERROR(Load("cuMemSetAccess", &d.set_access));
  SS_RETURN_IF_ERROR(Load("cuMemGetAllocationGranularity", &d.granularity));
  const CUmemAllocationProp prop = DeviceProp(device);
  size_t page = 0;
  // Fails where the device has no virtual memory management.
  const CUresult g =
      d.granularity(&page, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (g != CUDA_SUCCESS) {
    return absl::UnimplementedError(absl::StrCat(
        "cuda: no virtual memory management (cuMemGetAllocationGranularity: "
        "CUresult ",
        g, ")"));
  }
  if (page == 0) return absl::InternalError("cuda: zero page granularity");
  return std::unique_ptr<SharedPages>(new SharedPages(device, d, page));
}

SharedPages::SharedPages(int device, Driver driver, size_t page)
    : device_(device), driver_(driver), page_(page) {}

SharedPages::~SharedPages() {
  absl::MutexLock lock(&mu_);
  ReapLocked(/*wait=*/true);
  for (auto& [base, r] : ranges_) Destroy(base, r);
  ranges_.clear();
  kept_.clear();
}

SharedPages::Block::~Block() {
  if (handle != 0) {
    const CUresult r = driver->release(handle);
    if (r != CUDA_SUCCESS) LOG(ERROR) << "cuda: cuMemRelease: CUresult " << r;
  }
}

size_t SharedPages::RoundUp(size_t bytes) const {
  return (std::max<size_t>(bytes, 1) + page_ - 1) / page_ * page_;
}

bool SharedPages::Worthwhile(size_t bytes) const {
  return bytes >= page_ && (RoundUp(bytes) - bytes) * 8 <= bytes;
}

bool SharedPages::Owns(const void* p) const {
  absl::MutexLock lock(&mu_);
  return ranges_.count(reinterpret_cast<uintptr_t>(p)) != 0;
}

std::vector<size_t> SharedPages::BlockSizes(
    size_t from, size_t total, absl::Span<const size_t> cuts) const {
  std::vector<size_t> sizes;
  size_t at = from;
  for (size_t end : SharePieceEnds(from, total, page_, cuts)) {
    sizes.push_back(end - at);
    at = end;
  }
  return sizes;
}

SharedPages::Layout SharedPages::LayoutOf(const Range& r) {
  Layout l{r.bytes, {}};
  for (const Segment& g : r.segments) l.second.push_back(g.bytes);
  return l;
}

absl::StatusOr<std::shared_ptr<SharedPages::Block>> SharedPages::NewBlock(
    size_t bytes) {
  const CUmemAllocationProp prop = DeviceProp(device_);
  auto block = std::make_shared<Block>();
  block->driver = &driver_;
  SS_RETURN_IF_ERROR(DriverStatus(
      driver_.create(&block->handle, bytes, &prop, 0), "cuMemCreate"));
  return block;
}

absl::StatusOr<uintptr_t> SharedPages::Reserve(size_t bytes) {
  CUdeviceptr p = 0;
  SS_RETURN_IF_ERROR(DriverStatus(driver_.reserve(&p, bytes, page_, 0, 0),
                                  "cuMemAddressReserve"));
  return static_cast<uintptr_t>(p);
}

absl::Status SharedPages::MapAt(uintptr_t at, size_t bytes,
                                const Block& block) {
  return DriverStatus(driver_.map(at, bytes, 0, block.handle, 0), "cuMemMap");
}

absl::Status SharedPages::Grant(uintptr_t at, size_t bytes) {
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return DriverStatus(driver_.set_access(at, bytes, &access, 1),
                      "cuMemSetAccess");
}

void SharedPages::Destroy(uintptr_t base, Range& r) {
  for (const Segment& g : r.segments) {
    const CUresult u = driver_.unmap(base + g.offset, g.bytes);
    if (u != CUDA_SUCCESS) LOG(ERROR) << "cuda: cuMemUnmap: CUresult " << u;
  }
  r.segments.clear();  // a block goes with its last mapping
  const CUresult f = driver_.address_free(base, r.bytes);
  if (f != CUDA_SUCCESS) LOG(ERROR) << "cuda: cuMemAddressFree: CUresult " << f;
}

absl::StatusOr<uintptr_t> SharedPages::Build(
    size_t bytes, const std::vector<Segment>& borrowed,
    absl::Span<const size_t> cuts, cudaStream_t stream) {
  const size_t total = RoundUp(bytes);
  SS_ASSIGN_OR_RETURN(const uintptr_t base, Reserve(total));
  Range r;
  r.bytes = total;
  absl::Status s;
  size_t own = 0;  // where the fresh blocks start
  for (const Segment& g : borrowed) {
    if (g.offset + g.bytes > total) break;
    s = MapAt(base + g.offset, g.bytes, *g.block);
    if (!s.ok()) break;
    r.segments.push_back(g);
    own = g.offset + g.bytes;
  }
  if (s.ok()) {
    size_t at = own;
    for (size_t n : BlockSizes(own, total, cuts)) {
      absl::StatusOr<std::shared_ptr<Block>> fresh = NewBlock(n);
      s = fresh.status();
      if (s.ok()) s = MapAt(base + at, n, **fresh);
      if (!s.ok()) break;
      r.segments.push_back({at, n, *std::move(fresh)});
      at += n;
    }
  }
  if (s.ok()) s = Grant(base, total);
  if (s.ok() && own < total) {
    s = CudaStatus(cudaMemsetAsync(reinterpret_cast<void*>(base + own), 0,
                                   total - own, stream),
                   "cudaMemsetAsync");
  }
  if (!s.ok()) {
    Destroy(base, r);
    return s;
  }
  ranges_.emplace(base, std::move(r));
  return base;
}

absl::StatusOr<void*> SharedPages::Allocate(size_t bytes,
                                            absl::Span<const size_t> cuts,
                                            cudaStream_t stream) {
  absl::MutexLock lock(&mu_);
  ReapLocked(/*wait=*/false);
  const size_t total = RoundUp(bytes);
  auto kept = kept_.find(Layout{total, BlockSizes(0, total, cuts)});
  if (kept != kept_.end()) {
    const uintptr_t base = kept->second;
    kept_.erase(kept);
    SS_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(reinterpret_cast<void*>(base), 0, total, stream),
        "cudaMemsetAsync");
    return reinterpret_cast<void*>(base);
  }
  absl::StatusOr<uintptr_t> base = Build(bytes, {}, cuts, stream);
  if (absl::IsResourceExhausted(base.status()) && !kept_.empty()) {
    TrimLocked();
    base = Build(bytes, {}, cuts, stream);
  }
  SS_RETURN_IF_ERROR(base.status());
  return reinterpret_cast<void*>(*base);
}

absl::StatusOr<void*> SharedPages::AllocateSharing(size_t bytes,
                                                   const void* src,
                                                   size_t share, size_t* shared,
                                                   cudaStream_t stream) {
  *shared = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = ranges_.find(reinterpret_cast<uintptr_t>(src));
    // Whole blocks only, from the start.
    const size_t limit = std::min(share, bytes) / page_ * page_;
    std::vector<Segment> borrowed;
    if (it != ranges_.end()) {
      for (const Segment& g : it->second.segments) {
        if (g.offset + g.bytes > limit) break;
        borrowed.push_back(g);
      }
    }
    if (!borrowed.empty()) {
      ReapLocked(/*wait=*/false);
      absl::StatusOr<uintptr_t> base = Build(bytes, borrowed, {}, stream);
      if (absl::IsResourceExhausted(base.status()) && !kept_.empty()) {
        TrimLocked();
        base = Build(bytes, borrowed, {}, stream);
      }
      SS_RETURN_IF_ERROR(base.status());
      *shared = borrowed.back().offset + borrowed.back().bytes;
      return reinterpret_cast<void*>(*base);
    }
  }
  return Allocate(bytes, {}, stream);
}

absl::Status SharedPages::Unshare(const void* p, size_t from,
                                  cudaStream_t stream) {
  absl::MutexLock lock(&mu_);
  const uintptr_t base = reinterpret_cast<uintptr_t>(p);
  auto it = ranges_.find(base);
  if (it == ranges_.end()) return absl::OkStatus();
  Range& r = it->second;
  // Each shared block ending past `from` gets a fresh block of its size,
  // filled from the old one through a scratch mapping, then mapped in its
  // place (a mapping is only ever unmapped whole).
  struct Move {
    size_t segment;
    std::shared_ptr<Block> fresh;
    uintptr_t scratch;
  };
  std::vector<Move> moves;
  auto drop_scratch = [&]() {
    for (const Move& m : moves) {
      const size_t n = r.segments[m.segment].bytes;
      driver_.unmap(m.scratch, n);
      driver_.address_free(m.scratch, n);
    }
  };
  for (size_t i = 0; i < r.segments.size(); ++i) {
    const Segment& g = r.segments[i];
    if (g.offset + g.bytes <= from || g.block.use_count() == 1) continue;
    absl::StatusOr<std::shared_ptr<Block>> fresh = NewBlock(g.bytes);
    absl::StatusOr<uintptr_t> scratch =
        fresh.ok() ? Reserve(g.bytes)
                   : absl::StatusOr<uintptr_t>(fresh.status());
    absl::Status s = scratch.status();
    if (s.ok()) {
      s = MapAt(*scratch, g.bytes, **fresh);
      if (s.ok()) s = Grant(*scratch, g.bytes);
      if (!s.ok()) {
        driver_.unmap(*scratch, g.bytes);
        driver_.address_free(*scratch, g.bytes);
      }
    }
    if (s.ok()) {
      moves.push_back({i, *std::move(fresh), *scratch});
      s = CudaStatus(cudaMemcpyAsync(reinterpret_cast<void*>(*scratch),
                                     reinterpret_cast<void*>(base + g.offset),
                                     g.bytes, cudaMemcpyDeviceToDevice, stream),
                     "cudaMemcpyAsync");
    }
    if (!s.ok()) {
      cudaStreamSynchronize(stream);
      drop_scratch();
      return s;
    }
  }
  if (moves.empty()) return absl::OkStatus();
  // The copies, and every op that read the old blocks, are done.
  absl::Status s =
      CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  for (const Move& m : moves) {
    if (!s.ok()) break;
    Segment& g = r.segments[m.segment];
    const uintptr_t at = base + g.offset;
    s = DriverStatus(driver_.unmap(at, g.bytes), "cuMemUnmap");
    if (s.ok()) s = MapAt(at, g.bytes, *m.fresh);
    if (s.ok()) s = Grant(at, g.bytes);
    if (s.ok()) g.block = m.fresh;
  }
  drop_scratch();
  return s;
}

void SharedPages::Release(void* p, cudaStream_t stream) {
  absl::MutexLock lock(&mu_);
  cudaEvent_t done = nullptr;
  if (cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess ||
      cudaEventRecord(done, stream) != cudaSuccess) {
    // Without an event, wait for the stream instead.
    cudaGetLastError();
    if (done != nullptr) cudaEventDestroy(done);
    done = nullptr;
    cudaStreamSynchronize(stream);
  }
  pending_.push_back({reinterpret_cast<uintptr_t>(p), done});
  ReapLocked(/*wait=*/false);
}

void SharedPages::ReapLocked(bool wait) {
  std::vector<PendingRelease> still;
  for (PendingRelease& pr : pending_) {
    if (pr.done != nullptr) {
      const cudaError_t q =
          wait ? cudaEventSynchronize(pr.done) : cudaEventQuery(pr.done);
      if (q == cudaErrorNotReady) {
        still.push_back(pr);
        continue;
      }
      if (q != cudaSuccess) cudaGetLastError();
      cudaEventDestroy(pr.done);
    }
    auto it = ranges_.find(pr.base);
    if (it == ranges_.end()) continue;
    Range& r = it->second;
    const bool own =
        std::all_of(r.segments.begin(), r.segments.end(),
                    [](const Segment& g) { return g.block.use_count() == 1; });
    if (own) {
      kept_.emplace(LayoutOf(r), pr.base);
    } else {
      Destroy(pr.base, r);
      ranges_.erase(it);
    }
  }
  pending_ = std::move(still);
}

void SharedPages::Trim() {
  absl::MutexLock lock(&mu_);
  TrimLocked();
}

void SharedPages::TrimLocked() {
  for (const auto& [layout, base] : kept_) {
    auto it = ranges_.find(base);
    if (it == ranges_.end()) continue;
    Destroy(base, it->second);
    ranges_.erase(it);
  }
  kept_.clear();
}

}  // namespace specserve::kernels::cuda
