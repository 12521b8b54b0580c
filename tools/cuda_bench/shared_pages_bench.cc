// Benchmark of the CUDA backend's shared pages (kernels/cuda/shared_pages.h)
// and of the virtual-memory driver calls under them: where a fork's time
// goes (docs/DESIGN.md "Shared pages"). Their behaviour is
// kernels/cuda/shared_pages_test's.
//   allocation    a session's attention caches on the 27B shape (32 buffers
//                 of 8,256 rows x 2 KiB: 9 pages each): fresh, fresh again,
//                 reused, sharing 8 pages of a source's, and from the
//                 stream-ordered pool (cudaMallocAsync), ms per 32 buffers;
//   driver_calls  each call's cost by size (a 2 MiB page, an 8-page block,
//                 8 pages one by one), whether mapping part of a block works
//                 (the CUresult), and 8 fork-like mappings of 32 buffers x 8
//                 shared pages: one thread against 8 threads, as 32 ranges,
//                 as one range per fork, and as one 8-page block a buffer.
//
// Usage: shared_pages_bench [allocation] [driver_calls]  (default: both)
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "tools/bench_timing/bench_check.h"

namespace specserve::kernels::cuda {
namespace {

// A driver call that must succeed for the figures to mean anything.
#define DRIVER_CHECK(expr)                             \
  do {                                                 \
    const CUresult bench_result_ = (expr);             \
    if (bench_result_ != CUDA_SUCCESS) {               \
      std::fprintf(stderr, "%s: CUresult %d\n", #expr, \
                   static_cast<int>(bench_result_));   \
      std::exit(1);                                    \
    }                                                  \
  } while (0)

constexpr size_t kMiB = size_t{1} << 20;

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now() - t0)
      .count();
}

void AllocationBench(Backend* be) {
  constexpr size_t kBytes = size_t{8256} * 2048;
  constexpr int kBuffers = 32;
  auto time = [&](const char* what, const std::function<void(int)>& make) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kBuffers; ++i) make(i);
    BENCH_CHECK(be->Synchronize());
    std::printf("cost %s: %.1f ms per %d buffers of %zu bytes\n", what,
                MsSince(t0), kBuffers, kBytes);
  };
  auto keep = [](absl::StatusOr<Buffer> b, std::vector<Buffer>* into) {
    BENCH_CHECK(b.status());
    into->push_back(*std::move(b));
  };
  std::vector<Buffer> src, held;
  time("fresh", [&](int) { keep(be->AllocateShareable(kBytes, {}), &src); });
  time("fresh again",
       [&](int) { keep(be->AllocateShareable(kBytes, {}), &held); });
  held.clear();
  BENCH_CHECK(be->Synchronize());
  time("reused", [&](int) { keep(be->AllocateShareable(kBytes, {}), &held); });
  held.clear();
  time("sharing 8 pages", [&](int i) {
    size_t shared = 0;
    keep(be->AllocateSharing(kBytes, src[i], 8192 * 2048, &shared), &held);
  });
  time("pool (cudaMallocAsync)",
       [&](int) { keep(be->Allocate(kBytes), &src); });
}

// The driver's entry point of `name` (CUDA 12.0 ABI), or null.
template <typename F>
F DriverCall(const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  return reinterpret_cast<F>(p);
}

// The virtual-memory driver calls a fork makes.
struct Driver {
  decltype(&cuMemCreate) create =
      DriverCall<decltype(&cuMemCreate)>("cuMemCreate");
  decltype(&cuMemRelease) release =
      DriverCall<decltype(&cuMemRelease)>("cuMemRelease");
  decltype(&cuMemAddressReserve) reserve =
      DriverCall<decltype(&cuMemAddressReserve)>("cuMemAddressReserve");
  decltype(&cuMemAddressFree) address_free =
      DriverCall<decltype(&cuMemAddressFree)>("cuMemAddressFree");
  decltype(&cuMemMap) map = DriverCall<decltype(&cuMemMap)>("cuMemMap");
  decltype(&cuMemUnmap) unmap = DriverCall<decltype(&cuMemUnmap)>("cuMemUnmap");
  decltype(&cuMemSetAccess) set_access =
      DriverCall<decltype(&cuMemSetAccess)>("cuMemSetAccess");

  bool found() const {
    return create && release && reserve && address_free && map && unmap &&
           set_access;
  }
};

void DriverCallsBench() {
  const Driver d;
  if (!d.found()) {
    std::fprintf(stderr,
                 "shared_pages_bench: a cuMem* entry point is "
                 "missing\n");
    std::exit(1);
  }
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  constexpr size_t kPage = 2 * kMiB, kBlock = 8 * kPage;
  constexpr int kN = 64;
  auto per_call_us = [](const std::function<void(int)>& call) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kN; ++i) call(i);
    return 1e3 * MsSince(t0) / kN;
  };
  std::vector<CUmemGenericAllocationHandle> pages(kN), blocks(kN);
  std::vector<CUdeviceptr> va(kN);
  const double create_page = per_call_us(
      [&](int i) { DRIVER_CHECK(d.create(&pages[i], kPage, &prop, 0)); });
  const double create_block = per_call_us(
      [&](int i) { DRIVER_CHECK(d.create(&blocks[i], kBlock, &prop, 0)); });
  const double reserve_us = per_call_us([&](int i) {
    DRIVER_CHECK(d.reserve(&va[i], kBlock + kPage, kPage, 0, 0));
  });
  const double map_page = per_call_us([&](int i) {
    DRIVER_CHECK(d.map(va[i] + kBlock, kPage, 0, pages[i], 0));
  });
  const double map_block = per_call_us(
      [&](int i) { DRIVER_CHECK(d.map(va[i], kBlock, 0, blocks[i], 0)); });
  const double access_us = per_call_us([&](int i) {
    DRIVER_CHECK(d.set_access(va[i], kBlock + kPage, &access, 1));
  });
  const double unmap_block =
      per_call_us([&](int i) { DRIVER_CHECK(d.unmap(va[i], kBlock)); });
  // Pages 2..7 of a block mapped alone (a fork sharing part of a block);
  // shared_pages_test checks that the driver refuses it.
  const CUresult part = d.map(va[0], 6 * kPage, 2 * kPage, blocks[0], 0);
  if (part == CUDA_SUCCESS) d.unmap(va[0], 6 * kPage);
  const double map_pages = per_call_us([&](int i) {
    for (int j = 0; j < 8; ++j) {
      DRIVER_CHECK(d.map(va[i] + j * kPage, kPage, 0, pages[(i + j) % kN], 0));
    }
  });
  const double unmap_pages = per_call_us([&](int i) {
    for (int j = 0; j < 8; ++j) DRIVER_CHECK(d.unmap(va[i] + j * kPage, kPage));
  });
  std::printf(
      "driver call us: cuMemCreate page %.1f, 8 pages %.1f; "
      "cuMemAddressReserve %.1f; cuMemMap page %.1f, 8-page block %.1f, "
      "8 pages one by one %.1f; cuMemSetAccess 9 pages %.1f; cuMemUnmap "
      "8-page block %.1f, 8 pages one by one %.1f; a block's pages 2..7 "
      "mapped alone: CUresult %d\n",
      create_page, create_block, reserve_us, map_page, map_block, map_pages,
      access_us, unmap_block, unmap_pages, static_cast<int>(part));
  for (int i = 0; i < kN; ++i) {
    d.unmap(va[i] + kBlock, kPage);
    d.address_free(va[i], kBlock + kPage);
  }

  // A source's 32 buffers of 8 pages (a fork maps buffer b's pages into its
  // own buffer b, as Model::Fork does with each layer's keys and values).
  constexpr int kThreads = 8, kBuffers = 32;
  std::vector<CUmemGenericAllocationHandle> source(kBuffers * 8);
  for (auto& h : source) DRIVER_CHECK(d.create(&h, kPage, &prop, 0));
  // A fork's 32 buffers of 8 shared pages each: reserve, 8 maps, access;
  // then unmap and free. Adds the two halves' times to build_ms and
  // release_ms.
  auto fork_like = [&](double* build_ms, double* release_ms) {
    std::vector<CUdeviceptr> at(kBuffers);
    const auto t0 = std::chrono::steady_clock::now();
    for (int b = 0; b < kBuffers; ++b) {
      DRIVER_CHECK(d.reserve(&at[b], 9 * kPage, kPage, 0, 0));
      for (int j = 0; j < 8; ++j) {
        DRIVER_CHECK(d.map(at[b] + j * kPage, kPage, 0, source[8 * b + j], 0));
      }
      DRIVER_CHECK(d.set_access(at[b], 8 * kPage, &access, 1));
    }
    const auto t1 = std::chrono::steady_clock::now();
    for (int b = 0; b < kBuffers; ++b) {
      for (int j = 0; j < 8; ++j) d.unmap(at[b] + j * kPage, kPage);
      d.address_free(at[b], 9 * kPage);
    }
    *build_ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
    *release_ms += MsSince(t1);
  };
  double build_ms = 0, release_ms = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < kThreads; ++t) fork_like(&build_ms, &release_ms);
  const double serial = MsSince(t0);
  t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      cudaSetDevice(0);
      double b = 0, r = 0;
      fork_like(&b, &r);
    });
  }
  for (auto& th : threads) th.join();
  const double parallel = MsSince(t0);
  std::printf(
      "driver calls of %d fork-like mappings (%d buffers x 8 pages: reserve, "
      "map, access; then unmap, free): one thread %.1f ms (%.1f building, "
      "%.1f releasing), %d threads %.1f ms\n",
      kThreads, kBuffers, serial, build_ms, release_ms, kThreads, parallel);

  // The same pages as one range per fork: 32 buffers' worth of addresses
  // reserved, mapped and granted at once.
  double one_build_ms = 0, one_release_ms = 0;
  for (int t = 0; t < kThreads; ++t) {
    CUdeviceptr at = 0;
    const size_t stride = 9 * kPage, bytes = kBuffers * stride;
    const auto t0 = std::chrono::steady_clock::now();
    DRIVER_CHECK(d.reserve(&at, bytes, kPage, 0, 0));
    for (int b = 0; b < kBuffers; ++b) {
      for (int j = 0; j < 9; ++j) {
        DRIVER_CHECK(d.map(at + b * stride + j * kPage, kPage, 0,
                           j < 8 ? source[8 * b + j] : pages[(t + b) % kN], 0));
      }
    }
    DRIVER_CHECK(d.set_access(at, bytes, &access, 1));
    const auto t1 = std::chrono::steady_clock::now();
    for (size_t off = 0; off < bytes; off += kPage) d.unmap(at + off, kPage);
    d.address_free(at, bytes);
    one_build_ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
    one_release_ms += MsSince(t1);
  }
  std::printf(
      "driver calls of %d fork-like mappings as one range each (%d x 9 "
      "pages): %.1f ms building, %.1f ms releasing\n",
      kThreads, kBuffers, one_build_ms, one_release_ms);

  // The 8 shared pages as one 8-page block per buffer (one mapping), the
  // ninth page a block of its own: what a layout of multi-page blocks costs.
  double block_build_ms = 0, block_release_ms = 0;
  for (int t = 0; t < kThreads; ++t) {
    std::vector<CUdeviceptr> at(kBuffers);
    const auto t0 = std::chrono::steady_clock::now();
    for (int b = 0; b < kBuffers; ++b) {
      DRIVER_CHECK(d.reserve(&at[b], 9 * kPage, kPage, 0, 0));
      DRIVER_CHECK(d.map(at[b], kBlock, 0, blocks[b % kN], 0));
      DRIVER_CHECK(d.map(at[b] + kBlock, kPage, 0, pages[(t + b) % kN], 0));
      DRIVER_CHECK(d.set_access(at[b], 9 * kPage, &access, 1));
    }
    const auto t1 = std::chrono::steady_clock::now();
    for (int b = 0; b < kBuffers; ++b) {
      d.unmap(at[b], kBlock);
      d.unmap(at[b] + kBlock, kPage);
      d.address_free(at[b], 9 * kPage);
    }
    block_build_ms +=
        std::chrono::duration<double, std::milli>(t1 - t0).count();
    block_release_ms += MsSince(t1);
  }
  std::printf(
      "driver calls of %d fork-like mappings of one 8-page block and a page "
      "(%d buffers): %.1f ms building, %.1f ms releasing\n",
      kThreads, kBuffers, block_build_ms, block_release_ms);
  for (int i = 0; i < kN; ++i) {
    d.release(pages[i]);
    d.release(blocks[i]);
  }
  for (auto h : source) d.release(h);
}

int Main(int argc, char** argv) {
  const std::set<std::string> kSections = {"allocation", "driver_calls"};
  std::set<std::string> run;
  for (int i = 1; i < argc; ++i) {
    if (kSections.count(argv[i]) == 0) {
      std::fprintf(stderr,
                   "usage: shared_pages_bench [allocation] [driver_calls]\n");
      return 2;
    }
    run.insert(argv[i]);
  }
  if (run.empty()) run = kSections;
  if (CudaDeviceCount() == 0) {
    std::printf(
        "shared_pages_bench: no CUDA device visible, nothing to time\n");
    return 0;
  }
  auto created = CreateCudaBackend(0);
  BENCH_CHECK(created.status());
  if (run.count("allocation")) AllocationBench(created->get());
  if (run.count("driver_calls")) DriverCallsBench();
  return 0;
}

}  // namespace
}  // namespace specserve::kernels::cuda

int main(int argc, char** argv) {
  return specserve::kernels::cuda::Main(argc, argv);
}
