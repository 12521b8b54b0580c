// The CUDA backend's shared pages (shared_pages.h) through the Backend
// interface: a buffer made sharing another's pages reads its bytes and sees
// its writes (the same memory, not a copy); Unshare gives a buffer its own
// pages with the same contents, after which neither sees the other's
// writes; either buffer may outlive the other; small buffers share nothing.
// Skips without a GPU.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"

namespace specserve::kernels::cuda {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

class SharedPagesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    auto b = CreateCudaBackend(0);
    ASSERT_TRUE(b.ok()) << b.status();
    be_ = std::move(*b);
  }

  // Bytes [at, at + n) of `b` filled with `seed`-derived words.
  void Fill(const Buffer& b, size_t at, size_t n, uint32_t seed) {
    std::vector<uint32_t> x(n / 4);
    for (size_t i = 0; i < x.size(); ++i) x[i] = seed * 2654435761u + i;
    ASSERT_TRUE(
        be_->CopyToDevice(static_cast<char*>(b.data()) + at, x.data(), n).ok());
  }
  std::vector<uint8_t> Read(const Buffer& b, size_t at, size_t n) {
    std::vector<uint8_t> x(n);
    EXPECT_TRUE(
        be_->CopyToHost(x.data(), static_cast<const char*>(b.data()) + at, n)
            .ok());
    return x;
  }

  std::unique_ptr<Backend> be_;
};

TEST_F(SharedPagesTest, ASharingBufferIsTheSourcesMemoryUntilUnshared) {
  auto src = be_->AllocateShareable(16 * kMiB, {});
  ASSERT_TRUE(src.ok()) << src.status();
  Fill(*src, 0, 16 * kMiB, 1);
  size_t shared = 0;
  // 5.5 MiB asked: whole pages only.
  auto dst =
      be_->AllocateSharing(16 * kMiB, *src, 5 * kMiB + kMiB / 2, &shared);
  ASSERT_TRUE(dst.ok()) << dst.status();
  ASSERT_GE(shared, 2 * kMiB);
  ASSERT_LE(shared, 5 * kMiB + kMiB / 2);
  EXPECT_EQ(Read(*dst, 0, shared), Read(*src, 0, shared));
  // Past the shared pages: zero-filled memory of its own.
  EXPECT_EQ(Read(*dst, shared, kMiB), std::vector<uint8_t>(kMiB, 0));
  // The same memory: a write through one shows through the other.
  Fill(*src, kMiB, 4096, 7);
  EXPECT_EQ(Read(*dst, kMiB, 4096), Read(*src, kMiB, 4096));
  // Unshared from inside the second page (Hopper's pages are 2 MiB; the
  // first stays shared): the contents are kept, and writes past the first
  // page no longer cross.
  const size_t page = 2 * kMiB;
  const std::vector<uint8_t> before = Read(*src, 0, shared);
  ASSERT_TRUE(be_->Unshare(*src, page + 100).ok());
  EXPECT_EQ(Read(*src, 0, shared), before);
  EXPECT_EQ(Read(*dst, 0, shared), before);
  Fill(*src, page, 4096, 9);
  EXPECT_EQ(Read(*dst, page, 4096),
            std::vector<uint8_t>(before.begin() + page,
                                 before.begin() + page + 4096));
  Fill(*src, 0, 4096, 11);  // page 0 is still one page
  EXPECT_EQ(Read(*dst, 0, 4096), Read(*src, 0, 4096));
  // The source goes first; the sharing buffer keeps the pages.
  const std::vector<uint8_t> kept = Read(*dst, 0, shared);
  *src = Buffer();
  ASSERT_TRUE(be_->Synchronize().ok());
  auto churn = be_->AllocateShareable(16 * kMiB, {});  // may reuse src's range
  ASSERT_TRUE(churn.ok());
  Fill(*churn, 0, 16 * kMiB, 13);
  EXPECT_EQ(Read(*dst, 0, shared), kept);
}

TEST_F(SharedPagesTest, ASharingBufferUnsharesItselfAndSharesOnward) {
  auto src = be_->AllocateShareable(12 * kMiB, {});
  ASSERT_TRUE(src.ok());
  Fill(*src, 0, 12 * kMiB, 3);
  size_t shared = 0;
  auto a = be_->AllocateSharing(12 * kMiB, *src, 8 * kMiB, &shared);
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(shared, 8 * kMiB);
  size_t shared_b = 0;
  auto b = be_->AllocateSharing(10 * kMiB, *a, 6 * kMiB, &shared_b);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(shared_b, 6 * kMiB);
  const std::vector<uint8_t> orig = Read(*src, 0, 8 * kMiB);
  EXPECT_EQ(Read(*b, 0, 6 * kMiB),
            std::vector<uint8_t>(orig.begin(), orig.begin() + 6 * kMiB));
  // `a` takes pages of its own from 0 and overwrites them.
  ASSERT_TRUE(be_->Unshare(*a, 0).ok());
  EXPECT_EQ(Read(*a, 0, 8 * kMiB), orig);
  Fill(*a, 0, 8 * kMiB, 5);
  EXPECT_EQ(Read(*src, 0, 8 * kMiB), orig);
  EXPECT_EQ(Read(*b, 0, 6 * kMiB),
            std::vector<uint8_t>(orig.begin(), orig.begin() + 6 * kMiB));
  // `src` and `b` still share; nothing to unshare on a buffer alone.
  Fill(*src, 0, 4096, 17);
  EXPECT_EQ(Read(*b, 0, 4096), Read(*src, 0, 4096));
  *a = Buffer();
  ASSERT_TRUE(be_->Unshare(*b, 0).ok());
  Fill(*b, 0, 4096, 19);
  EXPECT_NE(Read(*b, 0, 4096), Read(*src, 0, 4096));
}

// With share points the source is blocks between them (then single pages):
// a fork shares whole blocks only, and unsharing takes a whole block.
TEST_F(SharedPagesTest, ForksShareWholeBlocksBetweenSharePoints) {
  const size_t points[] = {6 * kMiB, 12 * kMiB + kMiB / 2};
  auto src = be_->AllocateShareable(16 * kMiB, points);
  ASSERT_TRUE(src.ok()) << src.status();
  Fill(*src, 0, 16 * kMiB, 29);
  // Blocks [0, 6), [6, 12), then pages [12, 14), [14, 16) (MiB).
  for (const auto& [ask, want] : {std::pair<size_t, size_t>{5 * kMiB, 0},
                                  {10 * kMiB, 6 * kMiB},
                                  {12 * kMiB, 12 * kMiB},
                                  {15 * kMiB, 14 * kMiB}}) {
    size_t shared = 1;
    auto dst = be_->AllocateSharing(16 * kMiB, *src, ask, &shared);
    ASSERT_TRUE(dst.ok()) << dst.status();
    EXPECT_EQ(shared, want) << "asked " << ask;
    EXPECT_EQ(Read(*dst, 0, shared), Read(*src, 0, shared));
    EXPECT_EQ(Read(*dst, shared, kMiB), std::vector<uint8_t>(kMiB, 0));
  }
  size_t shared = 0;
  auto dst = be_->AllocateSharing(16 * kMiB, *src, 12 * kMiB, &shared);
  ASSERT_TRUE(dst.ok());
  ASSERT_EQ(shared, 12 * kMiB);
  // Unshared from inside the second block: all of it is the fork's own, with
  // the same bytes; the first block still shows the source's writes.
  const std::vector<uint8_t> before = Read(*src, 0, shared);
  ASSERT_TRUE(be_->Unshare(*dst, 9 * kMiB).ok());
  EXPECT_EQ(Read(*dst, 0, shared), before);
  Fill(*src, 6 * kMiB, 4096, 31);
  EXPECT_EQ(Read(*dst, 6 * kMiB, 4096),
            std::vector<uint8_t>(before.begin() + 6 * kMiB,
                                 before.begin() + 6 * kMiB + 4096));
  Fill(*src, 0, 4096, 37);
  EXPECT_EQ(Read(*dst, 0, 4096), Read(*src, 0, 4096));
  // A fork of the fork shares its blocks onward, the borrowed one too.
  size_t onward = 0;
  auto next = be_->AllocateSharing(16 * kMiB, *dst, 16 * kMiB, &onward);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(onward, 16 * kMiB);
  EXPECT_EQ(Read(*next, 0, 16 * kMiB), Read(*dst, 0, 16 * kMiB));
}

TEST_F(SharedPagesTest, SmallBuffersShareNothing) {
  auto src = be_->AllocateShareable(64 * 1024, {});
  ASSERT_TRUE(src.ok());
  Fill(*src, 0, 64 * 1024, 23);
  size_t shared = 1;
  auto dst = be_->AllocateSharing(64 * 1024, *src, 64 * 1024, &shared);
  ASSERT_TRUE(dst.ok());
  EXPECT_EQ(shared, 0u);
  EXPECT_EQ(Read(*dst, 0, 64 * 1024), std::vector<uint8_t>(64 * 1024, 0));
  ASSERT_TRUE(be_->Unshare(*src, 0).ok());
}

// What a session's attention caches cost to allocate on the 27B shape (32
// buffers of 8,256 rows x 2 KiB: 9 pages each): fresh, reused, and sharing
// 8 pages of a source's; printed, not asserted.
TEST_F(SharedPagesTest, PrintsWhatAllocationCosts) {
  constexpr size_t kBytes = size_t{8256} * 2048;
  constexpr int kBuffers = 32;
  auto time = [&](const char* what, const std::function<void(int)>& make) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kBuffers; ++i) make(i);
    ASSERT_TRUE(be_->Synchronize().ok());
    const double ms = std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - t0)
                          .count();
    std::printf("cost %s: %.1f ms per %d buffers of %zu bytes\n", what, ms,
                kBuffers, kBytes);
  };
  std::vector<Buffer> src, held;
  time("fresh", [&](int) {
    auto b = be_->AllocateShareable(kBytes, {});
    ASSERT_TRUE(b.ok()) << b.status();
    src.push_back(*std::move(b));
  });
  time("fresh again", [&](int) {
    auto b = be_->AllocateShareable(kBytes, {});
    ASSERT_TRUE(b.ok()) << b.status();
    held.push_back(*std::move(b));
  });
  held.clear();
  ASSERT_TRUE(be_->Synchronize().ok());
  time("reused", [&](int) {
    auto b = be_->AllocateShareable(kBytes, {});
    ASSERT_TRUE(b.ok()) << b.status();
    held.push_back(*std::move(b));
  });
  held.clear();
  time("sharing 8 pages", [&](int i) {
    size_t shared = 0;
    auto b = be_->AllocateSharing(kBytes, src[i], 8192 * 2048, &shared);
    ASSERT_TRUE(b.ok()) << b.status();
    held.push_back(*std::move(b));
  });
  time("pool (cudaMallocAsync)", [&](int) {
    auto b = be_->Allocate(kBytes);
    ASSERT_TRUE(b.ok()) << b.status();
    src.push_back(*std::move(b));
  });
}

// What each virtual-memory driver call costs, by size (the page, a block of
// 8 pages, a sub-range of such a block), and whether calls from 8 threads
// overlap: where a fork's time goes (docs/DESIGN.md "Shared pages").
// Printed, never asserted.
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

TEST_F(SharedPagesTest, PrintsWhatEachDriverCallCosts) {
  auto create = DriverCall<decltype(&cuMemCreate)>("cuMemCreate");
  auto release = DriverCall<decltype(&cuMemRelease)>("cuMemRelease");
  auto reserve =
      DriverCall<decltype(&cuMemAddressReserve)>("cuMemAddressReserve");
  auto address_free =
      DriverCall<decltype(&cuMemAddressFree)>("cuMemAddressFree");
  auto map = DriverCall<decltype(&cuMemMap)>("cuMemMap");
  auto unmap = DriverCall<decltype(&cuMemUnmap)>("cuMemUnmap");
  auto set_access = DriverCall<decltype(&cuMemSetAccess)>("cuMemSetAccess");
  ASSERT_TRUE(create && release && reserve && address_free && map && unmap &&
              set_access);
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
    return std::chrono::duration<double, std::micro>(
               std::chrono::steady_clock::now() - t0)
               .count() /
           kN;
  };
  std::vector<CUmemGenericAllocationHandle> pages(kN), blocks(kN);
  std::vector<CUdeviceptr> va(kN);
  const double create_page = per_call_us([&](int i) {
    ASSERT_EQ(create(&pages[i], kPage, &prop, 0), CUDA_SUCCESS);
  });
  const double create_block = per_call_us([&](int i) {
    ASSERT_EQ(create(&blocks[i], kBlock, &prop, 0), CUDA_SUCCESS);
  });
  const double reserve_us = per_call_us([&](int i) {
    ASSERT_EQ(reserve(&va[i], kBlock + kPage, kPage, 0, 0), CUDA_SUCCESS);
  });
  const double map_page = per_call_us([&](int i) {
    ASSERT_EQ(map(va[i] + kBlock, kPage, 0, pages[i], 0), CUDA_SUCCESS);
  });
  const double map_block = per_call_us([&](int i) {
    ASSERT_EQ(map(va[i], kBlock, 0, blocks[i], 0), CUDA_SUCCESS);
  });
  const double access_us = per_call_us([&](int i) {
    ASSERT_EQ(set_access(va[i], kBlock + kPage, &access, 1), CUDA_SUCCESS);
  });
  const double unmap_block = per_call_us(
      [&](int i) { ASSERT_EQ(unmap(va[i], kBlock), CUDA_SUCCESS); });
  // Pages 2..7 of a block mapped alone (a fork sharing part of a block):
  // the driver refuses it, so a shared page must be a block of its own.
  const CUresult part = map(va[0], 6 * kPage, 2 * kPage, blocks[0], 0);
  if (part == CUDA_SUCCESS) unmap(va[0], 6 * kPage);
  const double map_pages = per_call_us([&](int i) {
    for (int j = 0; j < 8; ++j) {
      ASSERT_EQ(map(va[i] + j * kPage, kPage, 0, pages[(i + j) % kN], 0),
                CUDA_SUCCESS);
    }
  });
  const double unmap_pages = per_call_us([&](int i) {
    for (int j = 0; j < 8; ++j) {
      ASSERT_EQ(unmap(va[i] + j * kPage, kPage), CUDA_SUCCESS);
    }
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
    unmap(va[i] + kBlock, kPage);
    address_free(va[i], kBlock + kPage);
  }

  // A fork's 32 buffers of 8 shared pages each: reserve, 8 maps, access.
  // A source's 32 buffers of 8 pages (a fork maps buffer b's pages into its
  // own buffer b, as Model::Fork does with each layer's keys and values).
  constexpr int kSourcePages = 32 * 8;
  std::vector<CUmemGenericAllocationHandle> source(kSourcePages);
  for (auto& h : source) ASSERT_EQ(create(&h, kPage, &prop, 0), CUDA_SUCCESS);
  // (build_ms and release_ms: the two halves' time on one thread)
  auto fork_like = [&](int buffers, double* build_ms, double* release_ms) {
    std::vector<CUdeviceptr> at(buffers);
    auto t0 = std::chrono::steady_clock::now();
    for (int b = 0; b < buffers; ++b) {
      ASSERT_EQ(reserve(&at[b], 9 * kPage, kPage, 0, 0), CUDA_SUCCESS);
      for (int j = 0; j < 8; ++j) {
        ASSERT_EQ(map(at[b] + j * kPage, kPage, 0, source[8 * b + j], 0),
                  CUDA_SUCCESS);
      }
      ASSERT_EQ(set_access(at[b], 8 * kPage, &access, 1), CUDA_SUCCESS);
    }
    auto t1 = std::chrono::steady_clock::now();
    for (int b = 0; b < buffers; ++b) {
      for (int j = 0; j < 8; ++j) unmap(at[b] + j * kPage, kPage);
      address_free(at[b], 9 * kPage);
    }
    auto t2 = std::chrono::steady_clock::now();
    *build_ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
    *release_ms += std::chrono::duration<double, std::milli>(t2 - t1).count();
  };
  constexpr int kThreads = 8, kBuffers = 32;
  double build_ms = 0, release_ms = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < kThreads; ++t) {
    fork_like(kBuffers, &build_ms, &release_ms);
  }
  const double serial = std::chrono::duration<double, std::milli>(
                            std::chrono::steady_clock::now() - t0)
                            .count();
  t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      cudaSetDevice(0);
      double b = 0, r = 0;
      fork_like(kBuffers, &b, &r);
    });
  }
  for (auto& th : threads) th.join();
  const double parallel = std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - t0)
                              .count();
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
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(reserve(&at, bytes, kPage, 0, 0), CUDA_SUCCESS);
    for (int b = 0; b < kBuffers; ++b) {
      for (int j = 0; j < 9; ++j) {
        ASSERT_EQ(map(at + b * stride + j * kPage, kPage, 0,
                      j < 8 ? source[8 * b + j] : pages[(t + b) % kN], 0),
                  CUDA_SUCCESS);
      }
    }
    ASSERT_EQ(set_access(at, bytes, &access, 1), CUDA_SUCCESS);
    auto t1 = std::chrono::steady_clock::now();
    for (size_t off = 0; off < bytes; off += kPage) unmap(at + off, kPage);
    address_free(at, bytes);
    auto t2 = std::chrono::steady_clock::now();
    one_build_ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
    one_release_ms +=
        std::chrono::duration<double, std::milli>(t2 - t1).count();
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
    auto t0 = std::chrono::steady_clock::now();
    for (int b = 0; b < kBuffers; ++b) {
      ASSERT_EQ(reserve(&at[b], 9 * kPage, kPage, 0, 0), CUDA_SUCCESS);
      ASSERT_EQ(map(at[b], kBlock, 0, blocks[b % kN], 0), CUDA_SUCCESS);
      ASSERT_EQ(map(at[b] + kBlock, kPage, 0, pages[(t + b) % kN], 0),
                CUDA_SUCCESS);
      ASSERT_EQ(set_access(at[b], 9 * kPage, &access, 1), CUDA_SUCCESS);
    }
    auto t1 = std::chrono::steady_clock::now();
    for (int b = 0; b < kBuffers; ++b) {
      unmap(at[b], kBlock);
      unmap(at[b] + kBlock, kPage);
      address_free(at[b], 9 * kPage);
    }
    auto t2 = std::chrono::steady_clock::now();
    block_build_ms +=
        std::chrono::duration<double, std::milli>(t1 - t0).count();
    block_release_ms +=
        std::chrono::duration<double, std::milli>(t2 - t1).count();
  }
  std::printf(
      "driver calls of %d fork-like mappings of one 8-page block and a page "
      "(%d buffers): %.1f ms building, %.1f ms releasing\n",
      kThreads, kBuffers, block_build_ms, block_release_ms);
  for (int i = 0; i < kN; ++i) {
    release(pages[i]);
    release(blocks[i]);
  }
  for (auto h : source) release(h);
}

}  // namespace
}  // namespace specserve::kernels::cuda
