// The CUDA backend's shared pages (shared_pages.h) through the Backend
// interface: a buffer made sharing another's pages reads its bytes and sees
// its writes (the same memory, not a copy); Unshare gives a buffer its own
// pages with the same contents, after which neither sees the other's
// writes; either buffer may outlive the other; small buffers share nothing;
// the driver maps a block only whole. What allocating and the driver calls
// cost is tools/cuda_bench/shared_pages_bench's. Skips without a GPU.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <memory>
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

// The driver entry point `name` (the CUDA 12.0 ABI), or null.
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

// The driver maps a physical allocation only whole: pages 2..7 of an 8-page
// block mapped alone are refused. That is why a fork shares whole blocks
// (ForksShareWholeBlocksBetweenSharePoints) and a session's KV is laid out
// in blocks between its share points.
TEST_F(SharedPagesTest, TheDriverMapsABlockOnlyWhole) {
  auto create = DriverCall<decltype(&cuMemCreate)>("cuMemCreate");
  auto release = DriverCall<decltype(&cuMemRelease)>("cuMemRelease");
  auto reserve =
      DriverCall<decltype(&cuMemAddressReserve)>("cuMemAddressReserve");
  auto address_free =
      DriverCall<decltype(&cuMemAddressFree)>("cuMemAddressFree");
  auto map = DriverCall<decltype(&cuMemMap)>("cuMemMap");
  auto unmap = DriverCall<decltype(&cuMemUnmap)>("cuMemUnmap");
  ASSERT_TRUE(create && release && reserve && address_free && map && unmap);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  constexpr size_t kPage = 2 * kMiB, kBlock = 8 * kPage;
  CUmemGenericAllocationHandle block;
  ASSERT_EQ(create(&block, kBlock, &prop, 0), CUDA_SUCCESS);
  CUdeviceptr va = 0;
  ASSERT_EQ(reserve(&va, kBlock, kPage, 0, 0), CUDA_SUCCESS);
  const CUresult part = map(va, 6 * kPage, 2 * kPage, block, 0);
  if (part == CUDA_SUCCESS) unmap(va, 6 * kPage);
  EXPECT_NE(part, CUDA_SUCCESS) << "pages 2..7 of a block mapped alone";
  // The whole block maps.
  EXPECT_EQ(map(va, kBlock, 0, block, 0), CUDA_SUCCESS);
  unmap(va, kBlock);
  address_free(va, kBlock);
  release(block);
}

}  // namespace
}  // namespace specserve::kernels::cuda
