// Decode/verify attention over a bf16 KV cache on CUDA (the tiled partial
// kernel, attention_tiled.cuh, serves these shapes): against the CPU backend
// on the same cache within fp32 tolerance, at contexts from one row to past
// where the chunk count saturates; each row alone equals the rows in one
// call bit for bit (verify == decode); a session batch (positions and cache
// tables) equals each session alone bit for bit, whatever else it holds; and
// the call is deterministic. Skips (GTEST_SKIP) when no GPU is visible.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/ops.h"

namespace specserve::kernels::cuda {
namespace {

struct Shape {
  int nh, nkv, hd;
};

class AttentionBf16Test : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
    auto b = CreateCudaBackend(0);
    ASSERT_TRUE(b.ok()) << b.status();
    gpu_ = std::move(*b);
    cpu_ = std::make_unique<cpu::CpuBackend>();
  }

  Buffer Up(Backend* be, const void* data, size_t bytes) {
    auto b = be->Allocate(bytes);
    EXPECT_TRUE(b.ok());
    EXPECT_TRUE(be->CopyToDevice(b->data(), data, bytes).ok());
    return std::move(*b);
  }
  std::vector<float> Down(Backend* be, const Buffer& b, size_t n) {
    std::vector<float> v(n);
    EXPECT_TRUE(be->CopyToHost(v.data(), b.data(), n * 4).ok());
    return v;
  }
  std::vector<float> Random(size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }
  // bf16 bits of n random values (truncated: any bf16 value will do).
  std::vector<uint16_t> RandomBf16(size_t n, float lo, float hi) {
    std::vector<uint16_t> out;
    out.reserve(n);
    for (float f : Random(n, lo, hi)) {
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      out.push_back(static_cast<uint16_t>(bits >> 16));
    }
    return out;
  }

  // One session's cache: `cap` rows of nkv·hd bf16 (K and V), on both
  // backends.
  struct Cache {
    Buffer kc, vc, kg, vg;
  };
  Cache MakeCache(const Shape& s, int cap) {
    const size_t n = static_cast<size_t>(cap) * s.nkv * s.hd;
    const std::vector<uint16_t> k = RandomBf16(n, -2, 2),
                                v = RandomBf16(n, -1, 1);
    Cache c;
    c.kc = Up(cpu_.get(), k.data(), n * 2);
    c.vc = Up(cpu_.get(), v.data(), n * 2);
    c.kg = Up(gpu_.get(), k.data(), n * 2);
    c.vg = Up(gpu_.get(), v.data(), n * 2);
    return c;
  }

  AttentionParams Params(const Shape& s, int rows, int first, const float* q,
                         const float* gate, const void* k, const void* v,
                         int cap, float* out) {
    AttentionParams p;
    p.rows = rows;
    p.num_heads = s.nh;
    p.num_kv_heads = s.nkv;
    p.head_dim = s.hd;
    p.q = q;
    p.q_row_stride = s.nh * s.hd;
    p.q_head_stride = s.hd;
    if (gate != nullptr) {
      p.gate = gate;
      p.gate_row_stride = s.nh * s.hd;
      p.gate_head_stride = s.hd;
    }
    p.k_cache = k;
    p.v_cache = v;
    p.kv_row_stride = s.nkv * s.hd;
    p.kv_dtype = DType::kBF16;
    p.capacity = cap;
    p.first_position = first;
    p.out = out;
    p.out_row_stride = s.nh * s.hd;
    p.scale = 1.0f / std::sqrt(float(s.hd));
    return p;
  }

  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<Backend> cpu_;
  std::mt19937 rng_{20261205};
};

// max |gpu − cpu| <= tol · max(1, max |cpu|); no NaN.
void ExpectClose(const std::vector<float>& cpu, const std::vector<float>& gpu,
                 double tol, const std::string& what) {
  ASSERT_EQ(cpu.size(), gpu.size()) << what;
  double big = 1, worst = 0;
  for (float x : cpu) big = std::max(big, double(std::fabs(x)));
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_FALSE(std::isnan(gpu[i])) << what << " at " << i;
    worst = std::max(worst, std::fabs(double(gpu[i]) - cpu[i]));
  }
  EXPECT_LE(worst, tol * big) << what;
}

const Shape kShapes[] = {{24, 4, 256}, {4, 2, 64}, {8, 1, 128}, {2, 2, 128}};

TEST_F(AttentionBf16Test, TiledKernelServesTheseShapes) {
  for (const Shape& s : kShapes) {
    AttentionParams p =
        Params(s, 1, 0, nullptr, nullptr, nullptr, nullptr, 1, nullptr);
    alignas(16) static const char kAligned[16] = {};
    p.k_cache = p.v_cache = kAligned;
    EXPECT_TRUE(AttentionTiledApplies(p)) << s.nh << "/" << s.hd;
  }
}

TEST_F(AttentionBf16Test, MatchesCpuAndEachRowAloneIsTheBatchsBits) {
  for (const Shape& s : kShapes) {
    for (int first : {0, 14, 300, 1100, 9000}) {
      for (int rows : {1, 5}) {
        for (bool gated : {false, true}) {
          const std::string what =
              absl::StrCat("nh=", s.nh, " nkv=", s.nkv, " hd=", s.hd,
                           " first=", first, " rows=", rows, " gated=", gated);
          const int cap = first + rows + 2;
          Cache c = MakeCache(s, cap);
          const size_t qn = static_cast<size_t>(rows) * s.nh * s.hd;
          const std::vector<float> q = Random(qn, -2, 2), g = Random(qn, -3, 3);
          Buffer qc = Up(cpu_.get(), q.data(), qn * 4),
                 gc = Up(cpu_.get(), g.data(), qn * 4),
                 qg = Up(gpu_.get(), q.data(), qn * 4),
                 gg = Up(gpu_.get(), g.data(), qn * 4);
          auto oc = cpu_->AllocateFloats(qn);
          auto og = gpu_->AllocateFloats(qn);
          ASSERT_TRUE(oc.ok() && og.ok());
          ASSERT_TRUE(
              cpu_->Attention(Params(s, rows, first, qc.f32(),
                                     gated ? gc.f32() : nullptr, c.kc.data(),
                                     c.vc.data(), cap, oc->f32()))
                  .ok());
          ASSERT_TRUE(
              gpu_->Attention(Params(s, rows, first, qg.f32(),
                                     gated ? gg.f32() : nullptr, c.kg.data(),
                                     c.vg.data(), cap, og->f32()))
                  .ok())
              << what;
          const std::vector<float> all = Down(gpu_.get(), *og, qn);
          // fp32 sums over up to ~9,000 keys in different orders.
          ExpectClose(Down(cpu_.get(), *oc, qn), all, 1e-4, what);
          // Deterministic, and each row alone has the batch's bits.
          const size_t row = static_cast<size_t>(s.nh) * s.hd;
          auto one = gpu_->AllocateFloats(row);
          ASSERT_TRUE(one.ok());
          for (int t = 0; t < rows; ++t) {
            ASSERT_TRUE(
                gpu_->Attention(Params(s, 1, first + t, qg.f32() + t * row,
                                       gated ? gg.f32() + t * row : nullptr,
                                       c.kg.data(), c.vg.data(), cap,
                                       one->f32()))
                    .ok());
            EXPECT_EQ(0, std::memcmp(Down(gpu_.get(), *one, row).data(),
                                     all.data() + t * row, row * 4))
                << what << " row " << t;
          }
        }
      }
    }
  }
}

// Sessions of different contexts in one call through the positions and cache
// tables: each row equals its session alone, bit for bit, in any company.
TEST_F(AttentionBf16Test, SessionBatchEqualsEachSessionAlone) {
  const Shape s{24, 4, 256};
  const std::vector<int> positions = {8191, 5, 2047, 300, 16999, 64, 1};
  const int n = static_cast<int>(positions.size());
  const size_t row = static_cast<size_t>(s.nh) * s.hd;
  std::vector<Cache> caches;
  std::vector<const void*> ks, vs;
  for (int pos : positions) {
    caches.push_back(MakeCache(s, pos + 1));
    ks.push_back(caches.back().kg.data());
    vs.push_back(caches.back().vg.data());
  }
  const std::vector<float> q = Random(n * row, -2, 2);
  Buffer qg = Up(gpu_.get(), q.data(), q.size() * 4);
  Buffer pos_g = Up(gpu_.get(), positions.data(), n * 4);
  Buffer k_g = Up(gpu_.get(), ks.data(), n * sizeof(void*));
  Buffer v_g = Up(gpu_.get(), vs.data(), n * sizeof(void*));
  auto out = gpu_->AllocateFloats(n * row);
  auto one = gpu_->AllocateFloats(row);
  ASSERT_TRUE(out.ok() && one.ok());
  AttentionParams p =
      Params(s, n, 0, qg.f32(), nullptr, nullptr, nullptr, 17000, out->f32());
  p.positions = static_cast<const int32_t*>(pos_g.data());
  p.k_caches = static_cast<const void* const*>(k_g.data());
  p.v_caches = static_cast<const void* const*>(v_g.data());
  p.max_position = 16999;
  ASSERT_TRUE(gpu_->Attention(p).ok());
  const std::vector<float> all = Down(gpu_.get(), *out, n * row);
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(
        gpu_->Attention(Params(s, 1, positions[i], qg.f32() + i * row, nullptr,
                               ks[i], vs[i], positions[i] + 1, one->f32()))
            .ok());
    EXPECT_EQ(0, std::memcmp(Down(gpu_.get(), *one, row).data(),
                             all.data() + i * row, row * 4))
        << "session " << i << " at position " << positions[i];
  }
}

}  // namespace
}  // namespace specserve::kernels::cuda
