#include "kernels/cuda/shared_pages.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/cuda/cuda_status.h"
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

absl::Status SharedPages::MapAt(uintptr_t at, const Block& block) {
  return DriverStatus(driver_.map(at, page_, 0, block.handle, 0), "cuMemMap");
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
  for (size_t i = 0; i < r.pages.size(); ++i) {
    const CUresult u = driver_.unmap(base + i * page_, page_);
    if (u != CUDA_SUCCESS) LOG(ERROR) << "cuda: cuMemUnmap: CUresult " << u;
  }
  r.pages.clear();  // a block goes with its last mapping
  const CUresult f = driver_.address_free(base, r.bytes);
  if (f != CUDA_SUCCESS) LOG(ERROR) << "cuda: cuMemAddressFree: CUresult " << f;
}

absl::StatusOr<uintptr_t> SharedPages::Build(
    size_t bytes, const std::vector<std::shared_ptr<Block>>& borrowed,
    cudaStream_t stream) {
  const size_t total = RoundUp(bytes);
  const size_t n = total / page_;
  SS_ASSIGN_OR_RETURN(const uintptr_t base, Reserve(total));
  Range r;
  r.bytes = total;
  absl::Status s;
  for (size_t i = 0; i < n && s.ok(); ++i) {
    std::shared_ptr<Block> block;
    if (i < borrowed.size()) {
      block = borrowed[i];
    } else {
      absl::StatusOr<std::shared_ptr<Block>> fresh = NewBlock(page_);
      s = fresh.status();
      if (!s.ok()) break;
      block = *std::move(fresh);
    }
    s = MapAt(base + i * page_, *block);
    if (s.ok()) r.pages.push_back(std::move(block));
  }
  if (s.ok()) s = Grant(base, total);
  const size_t own = std::min(borrowed.size(), n) * page_;
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

absl::StatusOr<void*> SharedPages::Allocate(size_t bytes, cudaStream_t stream) {
  absl::MutexLock lock(&mu_);
  ReapLocked(/*wait=*/false);
  const size_t total = RoundUp(bytes);
  auto kept = kept_.find(total);
  if (kept != kept_.end()) {
    const uintptr_t base = kept->second;
    kept_.erase(kept);
    SS_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(reinterpret_cast<void*>(base), 0, total, stream),
        "cudaMemsetAsync");
    return reinterpret_cast<void*>(base);
  }
  absl::StatusOr<uintptr_t> base = Build(bytes, {}, stream);
  if (absl::IsResourceExhausted(base.status()) && !kept_.empty()) {
    TrimLocked();
    base = Build(bytes, {}, stream);
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
    const size_t pages = std::min(share, bytes) / page_;  // whole pages only
    if (it != ranges_.end() && pages > 0) {
      const std::vector<std::shared_ptr<Block>>& from = it->second.pages;
      const std::vector<std::shared_ptr<Block>> borrowed(
          from.begin(), from.begin() + std::min(pages, from.size()));
      ReapLocked(/*wait=*/false);
      absl::StatusOr<uintptr_t> base = Build(bytes, borrowed, stream);
      if (absl::IsResourceExhausted(base.status()) && !kept_.empty()) {
        TrimLocked();
        base = Build(bytes, borrowed, stream);
      }
      SS_RETURN_IF_ERROR(base.status());
      *shared = borrowed.size() * page_;
      return reinterpret_cast<void*>(*base);
    }
  }
  return Allocate(bytes, stream);
}

absl::Status SharedPages::Unshare(const void* p, size_t from,
                                  cudaStream_t stream) {
  absl::MutexLock lock(&mu_);
  const uintptr_t base = reinterpret_cast<uintptr_t>(p);
  auto it = ranges_.find(base);
  if (it == ranges_.end()) return absl::OkStatus();
  Range& r = it->second;
  // Each shared page from `from`'s on gets a fresh block, filled from the
  // old page through a scratch mapping, then mapped in its place.
  struct Move {
    size_t page;
    std::shared_ptr<Block> fresh;
    uintptr_t scratch;
  };
  std::vector<Move> moves;
  auto drop_scratch = [&]() {
    for (const Move& m : moves) {
      driver_.unmap(m.scratch, page_);
      driver_.address_free(m.scratch, page_);
    }
  };
  for (size_t i = from / page_; i < r.pages.size(); ++i) {
    if (r.pages[i].use_count() == 1) continue;
    absl::StatusOr<std::shared_ptr<Block>> fresh = NewBlock(page_);
    absl::StatusOr<uintptr_t> scratch =
        fresh.ok() ? Reserve(page_) : absl::StatusOr<uintptr_t>(fresh.status());
    absl::Status s = scratch.status();
    if (s.ok()) {
      s = MapAt(*scratch, **fresh);
      if (s.ok()) s = Grant(*scratch, page_);
      if (!s.ok()) {
        driver_.unmap(*scratch, page_);
        driver_.address_free(*scratch, page_);
      }
    }
    if (s.ok()) {
      moves.push_back({i, *std::move(fresh), *scratch});
      s = CudaStatus(cudaMemcpyAsync(reinterpret_cast<void*>(*scratch),
                                     reinterpret_cast<void*>(base + i * page_),
                                     page_, cudaMemcpyDeviceToDevice, stream),
                     "cudaMemcpyAsync");
    }
    if (!s.ok()) {
      cudaStreamSynchronize(stream);
      drop_scratch();
      return s;
    }
  }
  if (moves.empty()) return absl::OkStatus();
  // The copies, and every op that read the old pages, are done.
  absl::Status s =
      CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  for (const Move& m : moves) {
    if (!s.ok()) break;
    const uintptr_t at = base + m.page * page_;
    s = DriverStatus(driver_.unmap(at, page_), "cuMemUnmap");
    if (s.ok()) s = MapAt(at, *m.fresh);
    if (s.ok()) s = Grant(at, page_);
    if (s.ok()) r.pages[m.page] = m.fresh;
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
    const bool own = std::all_of(
        r.pages.begin(), r.pages.end(),
        [](const std::shared_ptr<Block>& b) { return b.use_count() == 1; });
    if (own) {
      kept_.emplace(r.bytes, pr.base);
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
  for (const auto& [bytes, base] : kept_) {
    auto it = ranges_.find(base);
    if (it == ranges_.end()) continue;
    Destroy(base, it->second);
    ranges_.erase(it);
  }
  kept_.clear();
}

}  // namespace specserve::kernels::cuda
