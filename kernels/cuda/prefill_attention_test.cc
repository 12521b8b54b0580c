// The prefill attention (prefill_attention.cu, through
// CudaBackend::PrefillAttention) against the CPU backend's exact fp32
// attention, in the model's strided q / gate layout: within the bf16
// tolerance, NaN-free, every output written and nothing else; row
// invariance (one call == chunks == single rows, bit for bit; several
// sessions' slices in one call == each alone); determinism; its refusals;
// over a bf16 KV cache, the fp32 cache's bits. Its speed is
// tools/cuda_bench/prefill_ops_bench's. Every test skips when no CUDA device
// is visible.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/ops.h"

namespace specserve::kernels::cuda {
namespace {

struct Heads {
  int nh, nkv, hd;
};
constexpr Heads kQwen27B{24, 4, 256};  // the hot shape
constexpr Heads kSmall{4, 2, 64};      // the small default model

// max |cuda − cpu| <= 2e-2 · max |cpu| over a call's outputs (bf16 q, k, v
// and P against fp32).
constexpr double kTolerance = 2e-2;

// One problem's data, the same on both backends. Layout of
// worker/model/blocks.cc (FullAttentionBlock): a q row holds, per head, q
// then gate (head_dim each), then the keys and values (unused here); the
// cache rows past the call's last position are NaN (never read); `out` rows
// have `pad` floats past the heads (never written).
struct Problem {
  Heads heads;
  int rows = 0;   // T
  int first = 0;  // first_position
  bool gated = false;
  int64_t q_stride = 0, kv_stride = 0, out_stride = 0;
  int64_t capacity = 0;
  std::vector<float> q, k, v;
};

constexpr int kPastRows = 5;  // NaN cache rows past the call's positions
constexpr int kPad = 4;       // out floats past the heads, per row
const float kPoison = std::nanf("");

class PrefillAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
    auto b = CreateCudaBackend(0);
    ASSERT_TRUE(b.ok()) << b.status();
    gpu_ = std::move(*b);
    cpu_ = std::make_unique<cpu::CpuBackend>();
  }

  Backend* B(bool gpu) { return gpu ? gpu_.get() : cpu_.get(); }

  std::vector<float> Random(size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }

  // q, k ~ U(-qk, qk) (scores of scale·q·k ~ qk²/3 at scale 1/sqrt(hd)),
  // v ~ U(-1, 1), gate ~ U(-3, 3). `odd` strides defeat 16-byte loads.
  Problem Make(Heads h, int rows, int first, bool gated, float qk = 1.0f,
               bool odd = false) {
    Problem pr;
    pr.heads = h;
    pr.rows = rows;
    pr.first = first;
    pr.gated = gated;
    pr.q_stride = h.nh * 2 * h.hd + 2 * h.nkv * h.hd + (odd ? 1 : 0);
    pr.kv_stride = h.nkv * h.hd + (odd ? 3 : 0);
    pr.out_stride = h.nh * h.hd + kPad;
    pr.capacity = first + rows + kPastRows;
    pr.q = Random(rows * pr.q_stride, -qk, qk);
    if (gated) {
      const std::vector<float> g = Random(rows * pr.q_stride, -3, 3);
      for (int t = 0; t < rows; ++t) {
        for (int hh = 0; hh < h.nh; ++hh) {
          const int64_t at = t * pr.q_stride + hh * 2 * h.hd + h.hd;
          std::copy_n(g.begin() + at, h.hd, pr.q.begin() + at);
        }
      }
    }
    pr.k = Random(pr.capacity * pr.kv_stride, -qk, qk);
    pr.v = Random(pr.capacity * pr.kv_stride, -1, 1);
    for (int64_t i = (first + rows) * pr.kv_stride; i < pr.k.size(); ++i) {
      pr.k[i] = pr.v[i] = kPoison;
    }
    return pr;
  }

  // Problem data uploaded to one backend.
  struct Uploaded {
    Buffer q, k, v;
  };
  Uploaded Upload(bool gpu, const Problem& pr) {
    Uploaded u;
    u.q = Floats(gpu, pr.q);
    u.k = Floats(gpu, pr.k);
    u.v = Floats(gpu, pr.v);
    return u;
  }
  Buffer Floats(bool gpu, const std::vector<float>& host) {
    auto b = B(gpu)->AllocateFloats(host.size());
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok()) return Buffer();
    EXPECT_TRUE(
        B(gpu)->CopyToDevice(b->data(), host.data(), host.size() * 4).ok());
    return std::move(*b);
  }
  Buffer Poisoned(bool gpu, int rows, const Problem& pr) {
    return Floats(gpu, std::vector<float>(rows * pr.out_stride, kPoison));
  }
  std::vector<float> Down(bool gpu, const Buffer& b) {
    std::vector<float> v(b.bytes() / 4);
    EXPECT_TRUE(B(gpu)->CopyToHost(v.data(), b.data(), b.bytes()).ok());
    return v;
  }

  // Rows [r0, r0 + n) of the problem (positions first + r0 ...) into `out`.
  static AttentionParams Params(const Problem& pr, const Uploaded& u, int r0,
                                int n, float* out) {
    const Heads& h = pr.heads;
    AttentionParams p;
    p.rows = n;
    p.num_heads = h.nh;
    p.num_kv_heads = h.nkv;
    p.head_dim = h.hd;
    p.q = u.q.f32() + r0 * pr.q_stride;
    p.q_row_stride = pr.q_stride;
    p.q_head_stride = 2 * h.hd;
    if (pr.gated) {
      p.gate = p.q + h.hd;
      p.gate_row_stride = pr.q_stride;
      p.gate_head_stride = 2 * h.hd;
    }
    p.k_cache = u.k.f32();
    p.v_cache = u.v.f32();
    p.kv_row_stride = pr.kv_stride;
    p.capacity = pr.capacity;
    p.first_position = pr.first + r0;
    p.out = out;
    p.out_row_stride = pr.out_stride;
    p.scale = 1.0f / std::sqrt(static_cast<float>(h.hd));
    return p;
  }

  // The whole problem on one backend (PrefillAttention on the GPU; the
  // CPU's is its exact Attention).
  std::vector<float> Attend(bool gpu, const Problem& pr) {
    const Uploaded u = Upload(gpu, pr);
    Buffer out = Poisoned(gpu, pr.rows, pr);
    const absl::Status s =
        B(gpu)->PrefillAttention(Params(pr, u, 0, pr.rows, out.f32()));
    EXPECT_TRUE(s.ok()) << s;
    return Down(gpu, out);
  }

  // CUDA against the CPU within kTolerance; prints the max relative error.
  void ExpectMatchesCpu(const Problem& pr) {
    const Heads& h = pr.heads;
    const std::string what =
        absl::StrCat("nh=", h.nh, " nkv=", h.nkv, " hd=", h.hd, " T=", pr.rows,
                     " first=", pr.first, " gated=", pr.gated,
                     " q_stride=", pr.q_stride, " kv_stride=", pr.kv_stride);
    const std::vector<float> cpu = Attend(false, pr), gpu = Attend(true, pr);
    ASSERT_EQ(cpu.size(), gpu.size());
    double scale = 0.0, worst = 0.0;
    size_t worst_i = 0;
    for (int t = 0; t < pr.rows; ++t) {
      for (int e = 0; e < h.nh * h.hd; ++e) {
        const size_t i = t * pr.out_stride + e;
        ASSERT_FALSE(std::isnan(cpu[i])) << what << ": cpu NaN at " << i;
        ASSERT_FALSE(std::isnan(gpu[i]))
            << what << ": gpu NaN (or unwritten) at row " << t << " elem " << e;
        scale = std::max(scale, std::fabs(double(cpu[i])));
        const double d = std::fabs(double(gpu[i]) - double(cpu[i]));
        if (d > worst) worst = d, worst_i = i;
      }
      for (int e = h.nh * h.hd; e < pr.out_stride; ++e) {
        ASSERT_TRUE(std::isnan(gpu[t * pr.out_stride + e]))
            << what << ": wrote past the heads in row " << t;
      }
    }
    std::printf("prefill attention %s: max |cuda-cpu| / max |cpu| = %.3g\n",
                what.c_str(), worst / scale);
    EXPECT_LE(worst, kTolerance * scale)
        << what << " worst at " << worst_i << ": cpu " << cpu[worst_i]
        << " gpu " << gpu[worst_i];
  }

  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<Backend> cpu_;
  std::mt19937 rng_{20250611};
};

TEST_F(PrefillAttentionTest, MatchesCpu) {
  for (Heads h : {kQwen27B, kSmall}) {
    for (bool gated : {false, true}) {
      for (int rows : {1, 7, 64, 200, 1000}) {
        for (int first : {0, 37, 500}) {
          ExpectMatchesCpu(Make(h, rows, first, gated));
        }
      }
    }
  }
}

// Peaked scores (std 3): the running max moves between key blocks.
TEST_F(PrefillAttentionTest, MatchesCpuWithPeakedScores) {
  for (Heads h : {kQwen27B, kSmall}) {
    ExpectMatchesCpu(Make(h, 300, 45, true, 3.0f));
  }
}

// Head dims 64, 128 and 256; MHA (odd GQA group: one head per block);
// strides that are not multiples of 4 floats (no 16-byte loads).
TEST_F(PrefillAttentionTest, OtherShapesAndStrides) {
  ExpectMatchesCpu(Make(Heads{8, 2, 128}, 150, 70, true));
  ExpectMatchesCpu(Make(Heads{3, 3, 64}, 150, 70, false));
  ExpectMatchesCpu(Make(Heads{6, 2, 128}, 150, 70, true));
  ExpectMatchesCpu(Make(kSmall, 130, 3, true, 1.0f, /*odd=*/true));
  ExpectMatchesCpu(Make(kQwen27B, 70, 100, true, 1.0f, /*odd=*/true));
}

TEST_F(PrefillAttentionTest, LongContext) {
  ExpectMatchesCpu(Make(kSmall, 64, 32000, true));
  ExpectMatchesCpu(Make(kQwen27B, 16, 32768 - 16, true));
}

// One call of 1000 rows == the chunks [0,100), [100,613), [613,1000) (each
// at first_position = its start) == single rows, bit for bit.
TEST_F(PrefillAttentionTest, RowInvariant) {
  for (Heads h : {kQwen27B, kSmall}) {
    for (int first : {0, 37}) {
      const Problem pr = Make(h, 1000, first, /*gated=*/true);
      const Uploaded u = Upload(true, pr);
      const std::string what =
          absl::StrCat("hd=", h.hd, " nh=", h.nh, " first=", first);
      Buffer whole = Poisoned(true, pr.rows, pr);
      ASSERT_TRUE(
          gpu_->PrefillAttention(Params(pr, u, 0, pr.rows, whole.f32())).ok());
      const std::vector<float> ref = Down(true, whole);

      Buffer chunked = Poisoned(true, pr.rows, pr);
      const int bounds[] = {0, 100, 613, 1000};
      for (int c = 0; c < 3; ++c) {
        const int r0 = bounds[c], n = bounds[c + 1] - bounds[c];
        ASSERT_TRUE(
            gpu_->PrefillAttention(
                    Params(pr, u, r0, n, chunked.f32() + r0 * pr.out_stride))
                .ok());
      }
      const std::vector<float> got = Down(true, chunked);
      for (int t = 0; t < pr.rows; ++t) {
        ASSERT_EQ(0,
                  std::memcmp(&got[t * pr.out_stride], &ref[t * pr.out_stride],
                              h.nh * h.hd * sizeof(float)))
            << what << ": chunked row " << t << " differs";
      }

      Buffer one = Poisoned(true, 1, pr);
      for (int t : {0, 1, 15, 16, 63, 64, 65, 99, 100, 127, 128, 129, 500, 612,
                    613, 640, 777, 999}) {
        ASSERT_TRUE(
            gpu_->PrefillAttention(Params(pr, u, t, 1, one.f32())).ok());
        const std::vector<float> row = Down(true, one);
        ASSERT_EQ(0, std::memcmp(row.data(), &ref[t * pr.out_stride],
                                 h.nh * h.hd * sizeof(float)))
            << what << ": row " << t << " alone differs";
      }
    }
  }
}

// Several sessions' rows in one call (LaunchPrefillAttentionSlices: the
// suffixes of a PrefillBatch pass, short slices over long histories among
// them) == each slice's own call, bit for bit; for the small heads more
// slices than one launch's table holds; with and without 16-byte loads.
TEST_F(PrefillAttentionTest, SlicesEqualEachAlone) {
  for (Heads h : {kQwen27B, kSmall}) {
    for (bool odd : {false, true}) {
      std::vector<std::pair<int, int>> shapes = {
          {64, 3000}, {1, 0}, {200, 37}, {7, 500}, {130, 1}, {64, 64}};
      if (h.hd == kSmall.hd) {
        for (int i = 0; i < 34; ++i) shapes.push_back({1 + i % 9, 11 * i});
      }
      std::vector<Problem> prs;
      std::vector<Uploaded> ups;
      std::vector<Buffer> together;
      std::vector<std::vector<float>> alone;
      std::vector<AttentionParams> slices;
      for (const auto& [rows, first] : shapes) {
        prs.push_back(Make(h, rows, first, /*gated=*/true, 1.0f, odd));
      }
      for (const Problem& pr : prs) ups.push_back(Upload(true, pr));
      for (size_t i = 0; i < prs.size(); ++i) {
        Buffer out = Poisoned(true, prs[i].rows, prs[i]);
        ASSERT_TRUE(gpu_->PrefillAttention(
                            Params(prs[i], ups[i], 0, prs[i].rows, out.f32()))
                        .ok());
        alone.push_back(Down(true, out));
        together.push_back(Poisoned(true, prs[i].rows, prs[i]));
        slices.push_back(
            Params(prs[i], ups[i], 0, prs[i].rows, together.back().f32()));
      }
      // The kernel itself (a fallback would also match).
      ASSERT_TRUE(LaunchPrefillAttentionSlices(slices, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      for (size_t i = 0; i < prs.size(); ++i) {
        const std::vector<float> got = Down(true, together[i]);
        ASSERT_EQ(got.size(), alone[i].size());
        EXPECT_EQ(0, std::memcmp(got.data(), alone[i].data(),
                                 got.size() * sizeof(float)))
            << "hd=" << h.hd << " odd=" << odd << " slice " << i << " ("
            << shapes[i].first << " rows at " << shapes[i].second << ")";
      }
    }
  }
}

TEST_F(PrefillAttentionTest, Deterministic) {
  for (Heads h : {kQwen27B, kSmall}) {
    const Problem pr = Make(h, 1000, 500, /*gated=*/true);
    const Uploaded u = Upload(true, pr);
    std::vector<float> res[2];
    for (auto& r : res) {
      Buffer out = Poisoned(true, pr.rows, pr);
      ASSERT_TRUE(
          gpu_->PrefillAttention(Params(pr, u, 0, pr.rows, out.f32())).ok());
      r = Down(true, out);
    }
    EXPECT_EQ(0, std::memcmp(res[0].data(), res[1].data(),
                             res[0].size() * sizeof(float)))
        << "hd=" << h.hd;
  }
}

TEST_F(PrefillAttentionTest, Refusals) {
  const Problem pr = Make(kSmall, 8, 0, false);
  const Uploaded u = Upload(true, pr);
  Buffer out = Poisoned(true, pr.rows, pr);
  const AttentionParams good = Params(pr, u, 0, pr.rows, out.f32());
  ASSERT_TRUE(LaunchPrefillAttention(good, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  // A session batch is decode (never launched: the pointers are unread).
  Buffer table = Floats(true, std::vector<float>(16, 0.0f));
  AttentionParams batch = good;
  batch.positions = reinterpret_cast<const int32_t*>(table.data());
  batch.k_caches = reinterpret_cast<const void* const*>(table.data());
  batch.v_caches = reinterpret_cast<const void* const*>(table.data());
  batch.max_position = 7;
  EXPECT_EQ(LaunchPrefillAttention(batch, nullptr).code(),
            absl::StatusCode::kUnimplemented);

  AttentionParams past = good;
  past.first_position = pr.capacity - pr.rows + 1;
  EXPECT_EQ(LaunchPrefillAttention(past, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  AttentionParams groups = good;
  groups.num_kv_heads = 3;
  EXPECT_EQ(LaunchPrefillAttention(groups, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  AttentionParams no_q = good;
  no_q.q = nullptr;
  EXPECT_EQ(LaunchPrefillAttention(no_q, nullptr).code(),
            absl::StatusCode::kInvalidArgument);

  // The slices of one call share their shape fields.
  AttentionParams wider = good;
  wider.kv_row_stride += 4;
  const AttentionParams mixed[] = {good, wider};
  EXPECT_EQ(LaunchPrefillAttentionSlices(mixed, nullptr).code(),
            absl::StatusCode::kInvalidArgument);

  for (int hd : {32, 96, 100, 512}) {
    AttentionParams odd = good;
    odd.head_dim = hd;  // strides still fit: 2·64 per head, row of 4 heads
    odd.q_head_stride = hd;
    odd.kv_row_stride = 2 * hd;
    odd.out_row_stride = 4 * hd;
    EXPECT_EQ(LaunchPrefillAttention(odd, nullptr).code(),
              absl::StatusCode::kUnimplemented)
        << "hd=" << hd;
  }
}

// A bf16 KV cache: the GPU's scatter stores the CPU's bytes (nearest even);
// prefill attention over it gives the fp32 cache's bits (that kernel rounds
// an fp32 cache to bf16 the same way); decode attention over it gives the
// bits of an fp32 cache holding the widened values.
TEST_F(PrefillAttentionTest, Bf16CacheKeepsTheBits) {
  for (Heads h : {kQwen27B, kSmall}) {
    const Problem pr = Make(h, 300, 45, /*gated=*/true);
    const std::string what = absl::StrCat("hd=", h.hd, " nh=", h.nh);
    const Uploaded u = Upload(true, pr);
    const int64_t n = pr.capacity * pr.kv_stride;
    // Both caches to bf16 on the GPU, and k on the CPU for the bytes.
    auto to_bf16 = [&](Backend* be, const Buffer& src) {
      auto dst = be->Allocate(n * 2);
      EXPECT_TRUE(dst.ok());
      ScatterRowsParams sp;
      sp.rows = pr.capacity;
      sp.cols = sp.src_stride = sp.dst_row_stride = pr.kv_stride;
      sp.src = src.f32();
      sp.dst_base = dst->data();
      sp.dst_dtype = DType::kBF16;
      EXPECT_TRUE(be->ScatterRows(sp).ok());
      std::vector<uint16_t> host(n);
      EXPECT_TRUE(be->CopyToHost(host.data(), dst->data(), n * 2).ok());
      return std::make_pair(std::move(*dst), host);
    };
    auto [k16, k_bytes] = to_bf16(gpu_.get(), u.k);
    auto [v16, v_bytes] = to_bf16(gpu_.get(), u.v);
    const Buffer cpu_k = Floats(false, pr.k);
    EXPECT_EQ(k_bytes, to_bf16(cpu_.get(), cpu_k).second) << what;

    Buffer out32 = Poisoned(true, pr.rows, pr),
           out16 = Poisoned(true, pr.rows, pr);
    AttentionParams p32 = Params(pr, u, 0, pr.rows, out32.f32());
    AttentionParams p16 = p32;
    p16.out = out16.f32();
    p16.k_cache = k16.data();
    p16.v_cache = v16.data();
    p16.kv_dtype = DType::kBF16;
    ASSERT_TRUE(gpu_->PrefillAttention(p32).ok());
    ASSERT_TRUE(gpu_->PrefillAttention(p16).ok());
    std::vector<float> a = Down(true, out32), b = Down(true, out16);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4))
        << what << ": prefill attention, bf16 cache vs fp32 cache";

    // Decode attention: bf16 cache vs the widened values in fp32.
    auto widen = [](const std::vector<uint16_t>& x) {
      std::vector<float> f(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        const uint32_t bits = uint32_t{x[i]} << 16;
        std::memcpy(&f[i], &bits, 4);
      }
      return f;
    };
    const Buffer kw = Floats(true, widen(k_bytes)),
                 vw = Floats(true, widen(v_bytes));
    AttentionParams d32 = p32, d16 = p16;
    d32.k_cache = kw.f32();
    d32.v_cache = vw.f32();
    ASSERT_TRUE(gpu_->Attention(d32).ok());
    ASSERT_TRUE(gpu_->Attention(d16).ok());
    a = Down(true, out32);
    b = Down(true, out16);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4))
        << what << ": decode attention, bf16 cache vs widened fp32";
  }
}

}  // namespace
}  // namespace specserve::kernels::cuda
