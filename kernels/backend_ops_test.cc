// Every op of every compiled backend against the naive double references in
// reference_ops.h, over odd shapes (1, 3, 7, 17 and non-multiples of the
// vector width), plus the row-invariance property the verify path relies on:
// a row computed inside a T-row call is bit-identical to the same row alone.
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/reference_ops.h"
#include "kernels/sampling/sampling.h"
#include "kernels/session_batch_check.h"

namespace specserve::kernels {
namespace {

struct BackendCase {
  std::string name;
  std::function<std::unique_ptr<Backend>()> make;
};

std::vector<BackendCase> Backends() {
  return {
      {"cpu1",
       [] {
         return std::make_unique<cpu::CpuBackend>(cpu::CpuBackendOptions{1});
       }},
      {"cpu3",
       [] {
         return std::make_unique<cpu::CpuBackend>(cpu::CpuBackendOptions{3});
       }},
  };
}

std::vector<float> Random(size_t n, std::mt19937* rng, float lo = -1,
                          float hi = 1) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(*rng);
  return v;
}

// bf16 / f16 bit patterns of random values (round to nearest even / exact
// conversion through F16C semantics is not needed: any bit pattern of a
// finite value is a valid weight).
std::vector<uint16_t> RandomHalf(size_t n, DType dtype, std::mt19937* rng) {
  std::vector<uint16_t> v(n);
  std::uniform_real_distribution<float> d(-1, 1);
  for (auto& h : v) {
    float f = d(*rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if (dtype == DType::kBF16) {
      h = static_cast<uint16_t>(bits >> 16);
    } else {
      // f16: sign, exponent in [-8, 0], random mantissa.
      const uint16_t sign = (bits >> 31) << 15;
      const uint16_t exp = static_cast<uint16_t>(15 - (bits & 7)) << 10;
      h = sign | exp | static_cast<uint16_t>((bits >> 3) & 0x3ff);
    }
  }
  return v;
}

class BackendOpsTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { backend_ = Backends()[GetParam()].make(); }

  // Backend copy of host floats.
  Buffer Up(const std::vector<float>& v) {
    auto b = backend_->AllocateFloats(std::max<size_t>(v.size(), 1));
    EXPECT_TRUE(b.ok());
    EXPECT_TRUE(backend_->CopyToDevice(b->data(), v.data(), v.size() * 4).ok());
    return std::move(*b);
  }
  Buffer UpRaw(const void* data, size_t bytes) {
    auto b = backend_->Allocate(bytes);
    EXPECT_TRUE(b.ok());
    EXPECT_TRUE(backend_->CopyToDevice(b->data(), data, bytes).ok());
    return std::move(*b);
  }
  std::vector<float> Down(const Buffer& b, size_t n) {
    std::vector<float> v(n);
    EXPECT_TRUE(backend_->CopyToHost(v.data(), b.data(), n * 4).ok());
    return v;
  }

  std::unique_ptr<Backend> backend_;
  std::mt19937 rng_{1234};
};

// max |got − want| <= tol · max(1, max |want|); no NaN.
void ExpectClose(const std::vector<float>& got, const std::vector<double>& want,
                 double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1.0, worst = 0.0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << what << " NaN at " << i;
    worst = std::max(worst, std::fabs(got[i] - want[i]));
  }
  EXPECT_LE(worst, tol * scale) << what;
}

const int kSizes[] = {1, 3, 7, 17};

TEST_P(BackendOpsTest, Matmul) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int rows : kSizes) {
      for (int in : {1, 3, 7, 17, 40, 129}) {
        for (int out : {1, 3, 7, 17}) {
          for (bool acc : {false, true}) {
            const std::string what =
                std::string(DTypeName(dtype)) +
                " rows=" + std::to_string(rows) + " in=" + std::to_string(in) +
                " out=" + std::to_string(out) + " acc=" + std::to_string(acc);
            std::vector<float> x = Random(rows * in, &rng_);
            std::vector<float> y0 = Random(rows * out, &rng_);
            std::vector<float> wf;
            std::vector<uint16_t> wh;
            const void* wdata;
            if (dtype == DType::kF32) {
              wf = Random(out * in, &rng_);
              wdata = wf.data();
            } else {
              wh = RandomHalf(out * in, dtype, &rng_);
              wdata = wh.data();
            }
            Buffer xb = Up(x), yb = Up(y0);
            Buffer wb = UpRaw(wdata, out * in * DTypeSize(dtype));
            auto w = backend_->UploadWeight(dtype, wb.data(), out, in);
            ASSERT_TRUE(w.ok());
            ASSERT_TRUE(
                backend_->Matmul(DenseMatmul(rows, xb.f32(), *w, yb.f32(), acc))
                    .ok());
            ExpectClose(Down(yb, rows * out),
                        reference::Matmul(rows, in, out, x.data(), dtype, wdata,
                                          acc ? y0 : std::vector<float>{}),
                        1e-5 * std::max(1, in / 8), what);
          }
        }
      }
    }
  }
}

// A fused-norm matmul gives the bits of RmsNorm into a buffer followed by
// the plain matmul: short vectors (a warp per vector on CUDA) and long ones
// (a block), few rows (fused in the CUDA kernel) and many (normalised
// first), with accumulation and a row stride.
TEST_P(BackendOpsTest, MatmulFusedNormEqualsRmsNormThenMatmul) {
  for (int in : {256, 1032}) {
    for (int rows : {1, 3, 8, 9, 20}) {
      const int out = 45, xs = in + 4;
      std::vector<float> x = Random(rows * xs, &rng_, -3, 3),
                         nw = Random(in, &rng_), y0 = Random(rows * out, &rng_);
      std::vector<uint16_t> wh = RandomHalf(out * in, DType::kBF16, &rng_);
      Buffer xb = Up(x), nb = Up(nw), wb = UpRaw(wh.data(), wh.size() * 2);
      auto w = backend_->UploadWeight(DType::kBF16, wb.data(), out, in);
      ASSERT_TRUE(w.ok());
      MatmulParams p =
          DenseMatmul(rows, xb.f32(), *w, nullptr, /*accumulate=*/true);
      p.x_stride = xs;
      p.norm_weight = nb.f32();
      p.norm_eps = 1e-6f;
      Buffer fused = Up(y0), separate = Up(y0),
             normed = Up(std::vector<float>(rows * in));
      p.y = fused.f32();
      ASSERT_TRUE(backend_->Matmul(p).ok());
      ASSERT_TRUE(backend_->RmsNorm(FusedNormOf(p, normed.f32())).ok());
      MatmulParams plain =
          DenseMatmul(rows, normed.f32(), *w, separate.f32(), true);
      ASSERT_TRUE(backend_->Matmul(plain).ok());
      EXPECT_EQ(Down(fused, rows * out), Down(separate, rows * out))
          << "in=" << in << " rows=" << rows;
    }
  }
}

// A fused-SwiGLU matmul gives the bits of Swiglu into a buffer followed by
// the plain matmul, with accumulation and a row stride beyond [gate | up].
TEST_P(BackendOpsTest, MatmulFusedSwigluEqualsSwigluThenMatmul) {
  for (int in : {64, 1032}) {
    for (int rows : {1, 3, 9}) {
      const int out = 45, xs = 2 * in + 4;
      std::vector<float> x = Random(rows * xs, &rng_, -3, 3),
                         y0 = Random(rows * out, &rng_);
      std::vector<uint16_t> wh = RandomHalf(out * in, DType::kBF16, &rng_);
      Buffer xb = Up(x), wb = UpRaw(wh.data(), wh.size() * 2);
      auto w = backend_->UploadWeight(DType::kBF16, wb.data(), out, in);
      ASSERT_TRUE(w.ok());
      MatmulParams p =
          DenseMatmul(rows, xb.f32(), *w, nullptr, /*accumulate=*/true);
      p.x_stride = xs;
      p.swiglu = true;
      Buffer fused = Up(y0), separate = Up(y0),
             act = Up(std::vector<float>(rows * in));
      p.y = fused.f32();
      ASSERT_TRUE(backend_->Matmul(p).ok());
      ASSERT_TRUE(backend_->Swiglu(FusedSwigluOf(p, act.f32())).ok());
      ASSERT_TRUE(
          backend_
              ->Matmul(DenseMatmul(rows, act.f32(), *w, separate.f32(), true))
              .ok());
      EXPECT_EQ(Down(fused, rows * out), Down(separate, rows * out))
          << "in=" << in << " rows=" << rows;
      p.x_stride = 2 * in - 1;
      EXPECT_EQ(backend_->Matmul(p).code(), absl::StatusCode::kInvalidArgument);
    }
  }
}

TEST_P(BackendOpsTest, MatmulStridedRowsAreRowInvariant) {
  // Large enough that 16 rows run on the thread pool and 1 row does not.
  const int in = 301, out = 67, rows = 16, xs = 304, ys = 70;
  std::vector<float> x = Random(rows * xs, &rng_);
  std::vector<uint16_t> wh = RandomHalf(out * in, DType::kBF16, &rng_);
  Buffer xb = Up(x), yb = Up(std::vector<float>(rows * ys, 0.f));
  Buffer wb = UpRaw(wh.data(), wh.size() * 2);
  MatmulParams p;
  p.rows = rows;
  p.in = in;
  p.out = out;
  p.x = xb.f32();
  p.x_stride = xs;
  p.w_dtype = DType::kBF16;
  p.w = wb.data();
  p.y = yb.f32();
  p.y_stride = ys;
  ASSERT_TRUE(backend_->Matmul(p).ok());
  const std::vector<float> all = Down(yb, rows * ys);
  for (int t = 0; t < rows; ++t) {
    Buffer one = Up(std::vector<float>(out, 0.f));
    MatmulParams q = p;
    q.rows = 1;
    q.x = xb.f32() + t * xs;
    q.y = one.f32();
    q.y_stride = out;
    ASSERT_TRUE(backend_->Matmul(q).ok());
    const std::vector<float> r = Down(one, out);
    EXPECT_EQ(0, std::memcmp(r.data(), all.data() + t * ys, out * 4))
        << "row " << t;
  }
}

TEST_P(BackendOpsTest, RmsNorm) {
  for (int rows : kSizes) {
    for (int dim : kSizes) {
      for (bool plus_one : {true, false}) {
        std::vector<float> x = Random(rows * dim, &rng_),
                           w = Random(dim, &rng_);
        Buffer xb = Up(x), wb = Up(w), yb = Up(std::vector<float>(rows * dim));
        RmsNormParams p;
        p.rows = rows;
        p.dim = dim;
        p.x = xb.f32();
        p.x_stride = dim;
        p.y = yb.f32();
        p.y_stride = dim;
        p.weight = wb.f32();
        p.plus_one = plus_one;
        p.eps = 1e-6f;
        ASSERT_TRUE(backend_->RmsNorm(p).ok());
        ExpectClose(
            Down(yb, rows * dim),
            reference::RmsNorm(rows, dim, x.data(), w.data(), plus_one, 1e-6),
            1e-5, "rms_norm");
        // In place gives the same result.
        p.y = xb.f32();
        ASSERT_TRUE(backend_->RmsNorm(p).ok());
        EXPECT_EQ(Down(xb, rows * dim), Down(yb, rows * dim));
      }
    }
  }
}

TEST_P(BackendOpsTest, GatedRmsNorm) {
  for (int rows : kSizes) {
    for (int dim : kSizes) {
      std::vector<float> x = Random(rows * dim, &rng_),
                         z = Random(rows * dim, &rng_, -3, 3),
                         w = Random(dim, &rng_);
      Buffer xb = Up(x), zb = Up(z), wb = Up(w),
             yb = Up(std::vector<float>(rows * dim));
      GatedRmsNormParams p;
      p.rows = rows;
      p.dim = dim;
      p.x = xb.f32();
      p.x_stride = dim;
      p.z = zb.f32();
      p.z_stride = dim;
      p.y = yb.f32();
      p.y_stride = dim;
      p.weight = wb.f32();
      p.eps = 1e-6f;
      ASSERT_TRUE(backend_->GatedRmsNorm(p).ok());
      ExpectClose(Down(yb, rows * dim),
                  reference::GatedRmsNorm(rows, dim, x.data(), z.data(),
                                          w.data(), 1e-6),
                  1e-5, "gated_rms_norm");
    }
  }
}

// A grouped gate (heads inside wider token rows) gives the bits of the same
// gate values laid out densely.
TEST_P(BackendOpsTest, GatedRmsNormGroupedGate) {
  const int tokens = 3, heads = 4, dim = 8, wide = heads * dim + 5;
  const int rows = tokens * heads;
  std::vector<float> x = Random(rows * dim, &rng_), w = Random(dim, &rng_),
                     dense = Random(rows * dim, &rng_, -3, 3);
  std::vector<float> grouped(tokens * wide, 1e9f);  // poison outside the gates
  for (int t = 0; t < tokens; ++t) {
    for (int i = 0; i < heads * dim; ++i)
      grouped[t * wide + 2 + i] = dense[t * heads * dim + i];
  }
  Buffer xb = Up(x), wb = Up(w), db = Up(dense), gb = Up(grouped);
  std::vector<float> out[2];
  for (int g : {0, 1}) {
    Buffer yb = Up(std::vector<float>(rows * dim));
    GatedRmsNormParams p;
    p.rows = rows;
    p.dim = dim;
    p.x = xb.f32();
    p.x_stride = dim;
    p.z = g ? gb.f32() + 2 : db.f32();
    p.z_stride = dim;
    p.z_group = g ? heads : 0;
    p.z_group_stride = g ? wide : 0;
    p.y = yb.f32();
    p.y_stride = dim;
    p.weight = wb.f32();
    ASSERT_TRUE(backend_->GatedRmsNorm(p).ok());
    out[g] = Down(yb, rows * dim);
  }
  EXPECT_EQ(out[0], out[1]);
}

// Grouped vectors (heads inside wider token rows, x and y) give the bits of
// the same vectors laid out densely, in place too.
TEST_P(BackendOpsTest, RmsNormGrouped) {
  const int tokens = 3, heads = 4, dim = 8, wide = heads * 2 * dim + 5;
  const int rows = tokens * heads;
  std::vector<float> dense = Random(rows * dim, &rng_), w = Random(dim, &rng_);
  // Head h of token t at t·wide + 3 + h·2·dim (stride 2·dim, like q_proj's
  // [query | gate] heads); everything else is poison.
  std::vector<float> grouped(tokens * wide, 1e9f);
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < dim; ++i) {
      grouped[(r / heads) * wide + 3 + (r % heads) * 2 * dim + i] =
          dense[r * dim + i];
    }
  }
  Buffer db = Up(dense), gb = Up(grouped), wb = Up(w);
  Buffer yb = Up(std::vector<float>(rows * dim));
  RmsNormParams p;
  p.rows = rows;
  p.dim = dim;
  p.x = db.f32();
  p.x_stride = dim;
  p.y = yb.f32();
  p.y_stride = dim;
  p.weight = wb.f32();
  ASSERT_TRUE(backend_->RmsNorm(p).ok());
  const std::vector<float> want = Down(yb, rows * dim);
  p.x = p.y = gb.f32() + 3;
  p.x_stride = p.y_stride = 2 * dim;
  p.group = heads;
  p.x_group_stride = p.y_group_stride = wide;
  ASSERT_TRUE(backend_->RmsNorm(p).ok());
  const std::vector<float> got = Down(gb, tokens * wide);
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < dim; ++i) {
      ASSERT_EQ(got[(r / heads) * wide + 3 + (r % heads) * 2 * dim + i],
                want[r * dim + i])
          << "vector " << r << " element " << i;
    }
  }
  EXPECT_EQ(got[0], 1e9f) << "outside the vectors untouched";
  p.group = heads;
  p.y_group_stride = wide - 1;  // in place with different layouts
  EXPECT_EQ(backend_->RmsNorm(p).code(), absl::StatusCode::kInvalidArgument);
}

// Without per-row destinations, ScatterRows copies strided rows to
// consecutive rows of one buffer from dst_first_row.
TEST_P(BackendOpsTest, ScatterRowsBlock) {
  const int rows = 5, cols = 7, src_stride = 11, dst_stride = 9, first = 2;
  std::vector<float> src = Random(rows * src_stride, &rng_);
  Buffer sb = Up(src),
         db = Up(std::vector<float>((first + rows + 1) * dst_stride, -7.0f));
  ScatterRowsParams p;
  p.rows = rows;
  p.cols = cols;
  p.src = sb.f32();
  p.src_stride = src_stride;
  p.dst_base = db.f32();
  p.dst_first_row = first;
  p.dst_row_stride = dst_stride;
  ASSERT_TRUE(backend_->ScatterRows(p).ok());
  const std::vector<float> got = Down(db, (first + rows + 1) * dst_stride);
  for (int r = 0; r < first + rows + 1; ++r) {
    for (int c = 0; c < dst_stride; ++c) {
      const bool copied = r >= first && r < first + rows && c < cols;
      EXPECT_EQ(got[r * dst_stride + c],
                copied ? src[(r - first) * src_stride + c] : -7.0f)
          << "row " << r << " col " << c;
    }
  }
  p.dst_rows =
      reinterpret_cast<const int32_t*>(sb.f32());  // both modes at once
  EXPECT_EQ(backend_->ScatterRows(p).code(),
            absl::StatusCode::kInvalidArgument);
}

// bf16 of x, rounded to nearest with ties to even, from the two bf16
// neighbours of x in double (independent of the bit trick the backends use).
uint16_t NearestBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint16_t down = static_cast<uint16_t>(bits >> 16);
  if ((bits & 0xffffu) == 0) return down;
  const uint16_t up = static_cast<uint16_t>(down + 1);  // away from zero
  // (infinity stands at 2^128 for rounding, as in IEEE 754)
  auto widen = [](uint16_t h) {
    const uint32_t b = uint32_t{h} << 16;
    float f;
    std::memcpy(&f, &b, 4);
    return std::isinf(f) ? std::copysign(std::ldexp(1.0, 128), f) : double(f);
  };
  const double dd = std::fabs(double(x) - widen(down)),
               du = std::fabs(widen(up) - double(x));
  if (dd != du) return dd < du ? down : up;
  return (down & 1) == 0 ? down : up;
}

// A bf16 destination (a bf16 KV cache) holds each value rounded to nearest
// even, ties included; an Attention over it equals, bit for bit, one over an
// fp32 cache holding the same rounded values (the bf16 read is exact).
TEST_P(BackendOpsTest, Bf16KvCacheRoundsAndReadsExactly) {
  const int rows = 6, nh = 4, nkv = 2, hd = 24, cols = nkv * hd;
  // Ties and edges first: 1 + 2^-8 (tie, to even 1), 1 + 3·2^-8 (tie, up),
  // a subnormal (1e-40 rounds to the smallest bf16 subnormal), the largest
  // finite float (rounds to inf), zero and -0.
  {
    const std::vector<float> special = {
        1.00390625f, 1.01171875f, 1e-40f, std::numeric_limits<float>::max(),
        0.0f,        -0.0f};
    Buffer eb = Up(special);
    auto db = backend_->Allocate(special.size() * 2);
    ASSERT_TRUE(db.ok());
    ScatterRowsParams sp;
    sp.rows = 1;
    sp.cols = static_cast<int64_t>(special.size());
    sp.src = eb.f32();
    sp.src_stride = sp.dst_row_stride = sp.cols;
    sp.dst_base = db->data();
    sp.dst_dtype = DType::kBF16;
    ASSERT_TRUE(backend_->ScatterRows(sp).ok());
    std::vector<uint16_t> got(special.size());
    ASSERT_TRUE(
        backend_->CopyToHost(got.data(), db->data(), got.size() * 2).ok());
    const std::vector<uint16_t> want = {0x3f80, 0x3f82, 0x0001,
                                        0x7f80, 0x0000, 0x8000};
    EXPECT_EQ(got, want);
    for (size_t i = 0; i < special.size(); ++i) {
      EXPECT_EQ(NearestBf16(special[i]), want[i]) << "the test's reference";
    }
  }
  const std::vector<float> src = Random(rows * cols, &rng_, -3, 3);
  Buffer sb = Up(src);
  auto kb = backend_->Allocate(rows * cols * 2);
  ASSERT_TRUE(kb.ok());
  ScatterRowsParams sp;
  sp.rows = rows;
  sp.cols = cols;
  sp.src = sb.f32();
  sp.src_stride = cols;
  sp.dst_base = kb->data();
  sp.dst_row_stride = cols;
  sp.dst_dtype = DType::kBF16;
  ASSERT_TRUE(backend_->ScatterRows(sp).ok());
  std::vector<uint16_t> stored(rows * cols);
  ASSERT_TRUE(
      backend_->CopyToHost(stored.data(), kb->data(), stored.size() * 2).ok());
  std::vector<float> widened(stored.size());
  for (size_t i = 0; i < stored.size(); ++i) {
    ASSERT_EQ(stored[i], NearestBf16(src[i])) << "element " << i;
    const uint32_t b = uint32_t{stored[i]} << 16;
    std::memcpy(&widened[i], &b, 4);
  }

  std::vector<float> q = Random(rows * nh * hd, &rng_, -2, 2);
  Buffer qb = Up(q), fb = Up(widened),
         o16 = Up(std::vector<float>(rows * nh * hd)),
         o32 = Up(std::vector<float>(rows * nh * hd));
  AttentionParams p;
  p.rows = rows;
  p.num_heads = nh;
  p.num_kv_heads = nkv;
  p.head_dim = hd;
  p.q = qb.f32();
  p.q_row_stride = nh * hd;
  p.q_head_stride = hd;
  p.kv_row_stride = cols;
  p.capacity = rows;
  p.out_row_stride = nh * hd;
  p.scale = 0.2f;
  AttentionParams p16 = p, p32 = p;
  p16.k_cache = p16.v_cache = kb->data();
  p16.kv_dtype = DType::kBF16;
  p16.out = o16.f32();
  p32.k_cache = p32.v_cache = fb.f32();
  p32.out = o32.f32();
  ASSERT_TRUE(backend_->Attention(p16).ok());
  ASSERT_TRUE(backend_->Attention(p32).ok());
  EXPECT_EQ(Down(o16, rows * nh * hd), Down(o32, rows * nh * hd));
  p16.kv_dtype = DType::kF16;
  EXPECT_EQ(backend_->Attention(p16).code(),
            absl::StatusCode::kInvalidArgument);
}

// AttentionInputs is its six ops in order (q_norm, k_norm, RoPE of q and k,
// the K and V scatters): the same bits as issuing them one by one. A bad
// part is refused before any part runs: nothing is written.
// SampleRows is the host filters and draw of each chosen row (its definition;
// a device implementation may differ only where a long sum's order moves a
// boundary, checked on the GPU by kernels/cuda:sample_rows_test).
TEST_P(BackendOpsTest, SampleRowsDrawsTheHostFiltersTokens) {
  const int rows = 5, cols = 700;
  std::vector<float> x = Random(rows * cols, &rng_, -4, 4);
  for (int i = 0; i < cols; i += 3) x[2 * cols + i] = 1.5f;  // ties in row 2
  Buffer xb = Up(x);
  const std::vector<sampling::SamplingConfig> configs = {
      {0.8f, 0, 1.0f, 0.0f}, {1.0f, 20, 0.9f, 0.05f}, {1.2f, 0, 0.7f, 0.0f},
      {0.5f, 3, 1.0f, 0.0f}, {1.0f, 0, 1.0f, 0.1f},   {2.0f, 300, 1.0f, 0.0f}};
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  // Rows index[i] of `x` (cols wide) with configs[i]; no outputs set yet.
  auto rows_of = [&](const Buffer& x, const std::vector<int32_t>& index,
                     const sampling::SamplingConfig* configs) {
    return DenseSampleRows(static_cast<int64_t>(index.size()), x.f32(), cols,
                           index.data(), configs);
  };
  for (const sampling::SamplingConfig& c : configs) {
    const std::vector<int32_t> index = {4, 2, 2, 0, 3, 1};
    std::vector<sampling::SamplingConfig> cs(index.size(), c);
    std::vector<float> us;
    for (size_t i = 0; i < index.size(); ++i) us.push_back(uni(rng_));
    std::vector<int32_t> tokens(index.size(), -1);
    SampleRowsParams p = rows_of(xb, index, cs.data());
    p.uniform = us.data();
    p.token = tokens.data();
    ASSERT_TRUE(backend_->SampleRows(p).ok());
    for (size_t i = 0; i < index.size(); ++i) {
      std::vector<float> probs;
      ASSERT_TRUE(
          sampling::FilteredProbs(x.data() + index[i] * cols, cols, c, &probs)
              .ok());
      EXPECT_EQ(tokens[i], sampling::SampleIndex(probs, us[i]))
          << "row " << index[i];
    }
    // Bad input: refused, named, nothing drawn.
    SampleRowsParams bad = p;
    const float one = 1.0f;
    bad.uniform = &one;
    bad.rows = 1;
    EXPECT_EQ(backend_->SampleRows(bad).code(),
              absl::StatusCode::kInvalidArgument);
    const sampling::SamplingConfig greedy;
    bad = p;
    bad.rows = 1;
    bad.config = &greedy;
    EXPECT_EQ(backend_->SampleRows(bad).code(),
              absl::StatusCode::kInvalidArgument);
    bad = p;
    bad.token = nullptr;  // a call draws a token for every row
    EXPECT_EQ(backend_->SampleRows(bad).code(),
              absl::StatusCode::kInvalidArgument);
  }
  x[cols + 9] = std::numeric_limits<float>::quiet_NaN();
  Buffer nan_b = Up(x);
  int32_t token = -1;
  const float u = 0.5f;
  const std::vector<int32_t> row1 = {1};
  SampleRowsParams p = rows_of(nan_b, row1, &configs[0]);
  p.uniform = &u;
  p.token = &token;
  EXPECT_EQ(backend_->SampleRows(p).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_P(BackendOpsTest, AttentionInputsIsTheSixOpsAndRefusesBadInputWhole) {
  const int rows = 3, nh = 4, nkv = 2, hd = 8, rot = 4, first = 6, cap = 12;
  const int kv = nkv * hd, W = nh * 2 * hd + 2 * kv;  // AttentionInputsOf's row
  const std::vector<float> qkv = Random(rows * W, &rng_, -2, 2);
  const std::vector<float> qw = Random(hd, &rng_), kw = Random(hd, &rng_);
  const std::vector<float> inv = RopeInvFreq(10000.0, rot);
  Buffer qwb = Up(qw), kwb = Up(kw), fb = Up(inv);
  auto params = [&](float* x, float* kc, float* vc) {
    FusedQkvRows r;
    r.rows = rows;
    r.heads = nh;
    r.kv_heads = nkv;
    r.head_dim = hd;
    r.rotary_dim = rot;
    r.x = x;
    r.q_norm = qwb.f32();
    r.k_norm = kwb.f32();
    r.inv_freq = fb.f32();
    AttentionInputsParams p = AttentionInputsOf(r);
    p.q_rope.first_position = p.k_rope.first_position = first;
    p.k_scatter.dst_base = kc;
    p.v_scatter.dst_base = vc;
    p.k_scatter.dst_first_row = p.v_scatter.dst_first_row = first;
    return p;
  };
  const std::vector<float> zeros(cap * kv, 0.0f);
  Buffer x1 = Up(qkv), k1 = Up(zeros), v1 = Up(zeros);
  Buffer x2 = Up(qkv), k2 = Up(zeros), v2 = Up(zeros);
  ASSERT_TRUE(
      backend_->AttentionInputs(params(x1.f32(), k1.f32(), v1.f32())).ok());
  const AttentionInputsParams six = params(x2.f32(), k2.f32(), v2.f32());
  ASSERT_TRUE(backend_->RmsNorm(six.q_norm).ok());
  ASSERT_TRUE(backend_->RmsNorm(six.k_norm).ok());
  ASSERT_TRUE(backend_->Rope(six.q_rope).ok());
  ASSERT_TRUE(backend_->Rope(six.k_rope).ok());
  ASSERT_TRUE(backend_->ScatterRows(six.k_scatter).ok());
  ASSERT_TRUE(backend_->ScatterRows(six.v_scatter).ok());
  EXPECT_EQ(Down(x1, qkv.size()), Down(x2, qkv.size()));
  EXPECT_EQ(Down(k1, zeros.size()), Down(k2, zeros.size()));
  EXPECT_EQ(Down(v1, zeros.size()), Down(v2, zeros.size()));
  EXPECT_NE(Down(x1, qkv.size()), qkv);
  EXPECT_NE(Down(k1, zeros.size()), zeros);

  // The last part is bad (both scatter modes at once): INVALID_ARGUMENT,
  // and the first five did not run.
  Buffer x3 = Up(qkv), k3 = Up(zeros), v3 = Up(zeros);
  AttentionInputsParams bad = params(x3.f32(), k3.f32(), v3.f32());
  bad.v_scatter.dst_rows = reinterpret_cast<const int32_t*>(fb.f32());
  EXPECT_EQ(backend_->AttentionInputs(bad).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Down(x3, qkv.size()), qkv);
  EXPECT_EQ(Down(k3, zeros.size()), zeros);
  EXPECT_EQ(Down(v3, zeros.size()), zeros);
}

TEST_P(BackendOpsTest, Rope) {
  for (int rows : kSizes) {
    for (int heads : {1, 3}) {
      for (int hd : {2, 8, 18}) {
        for (int rot : {2, hd / 2 - (hd / 2) % 2, hd}) {
          if (rot <= 0) continue;
          const int first = rows == 7 ? 1000 : 5;
          std::vector<float> x = Random(rows * heads * hd, &rng_);
          Buffer xb = Up(x);
          const std::vector<float> inv = RopeInvFreq(10000.0, rot);
          Buffer fb = Up(inv);
          RopeParams p;
          p.rows = rows;
          p.heads = heads;
          p.head_dim = hd;
          p.rotary_dim = rot;
          p.x = xb.f32();
          p.row_stride = heads * hd;
          p.head_stride = hd;
          p.first_position = first;
          p.inv_freq = fb.f32();
          ASSERT_TRUE(backend_->Rope(p).ok());
          // Angles are formed in fp32: error grows with the position.
          ExpectClose(
              Down(xb, x.size()),
              reference::Rope(rows, heads, hd, rot, x.data(), first, 10000.0),
              first >= 1000 ? 1e-3 : 1e-5, "rope");
        }
      }
    }
  }
}

TEST_P(BackendOpsTest, Attention) {
  for (int rows : kSizes) {
    for (auto [nh, nkv] : {std::pair{1, 1}, std::pair{4, 2}, std::pair{3, 1}}) {
      for (int hd : {1, 7, 17}) {
        for (int first : {0, 5}) {
          for (bool gated : {false, true}) {
            const int cap = first + rows + 2;
            std::vector<float> q = Random(rows * nh * hd, &rng_, -2, 2);
            std::vector<float> g = Random(rows * nh * hd, &rng_, -3, 3);
            std::vector<float> k = Random(cap * nkv * hd, &rng_, -2, 2);
            std::vector<float> v = Random(cap * nkv * hd, &rng_);
            Buffer qb = Up(q), gb = Up(g), kb = Up(k), vb = Up(v),
                   ob = Up(std::vector<float>(rows * nh * hd));
            AttentionParams p;
            p.rows = rows;
            p.num_heads = nh;
            p.num_kv_heads = nkv;
            p.head_dim = hd;
            p.q = qb.f32();
            p.q_row_stride = nh * hd;
            p.q_head_stride = hd;
            if (gated) {
              p.gate = gb.f32();
              p.gate_row_stride = nh * hd;
              p.gate_head_stride = hd;
            }
            p.k_cache = kb.f32();
            p.v_cache = vb.f32();
            p.kv_row_stride = nkv * hd;
            p.capacity = cap;
            p.first_position = first;
            p.out = ob.f32();
            p.out_row_stride = nh * hd;
            p.scale = 1.0f / std::sqrt(float(hd));
            ASSERT_TRUE(backend_->Attention(p).ok());
            const std::vector<float> all = Down(ob, rows * nh * hd);
            ExpectClose(all,
                        reference::Attention(rows, nh, nkv, hd, q.data(),
                                             gated ? g.data() : nullptr,
                                             k.data(), v.data(), first,
                                             1.0 / std::sqrt(double(hd))),
                        1e-5, "attention");
            // Row invariance: the last row alone.
            AttentionParams one = p;
            one.rows = 1;
            one.first_position = first + rows - 1;
            one.q = qb.f32() + (rows - 1) * nh * hd;
            if (gated) one.gate = gb.f32() + (rows - 1) * nh * hd;
            Buffer o1 = Up(std::vector<float>(nh * hd));
            one.out = o1.f32();
            ASSERT_TRUE(backend_->Attention(one).ok());
            EXPECT_EQ(
                0, std::memcmp(Down(o1, nh * hd).data(),
                               all.data() + (rows - 1) * nh * hd, nh * hd * 4));
          }
        }
      }
    }
  }
}

// Shapes large enough that a 16-row call splits over the thread pool while a
// 1-row call does not: rows must still agree bit for bit.
TEST_P(BackendOpsTest, LargeAttentionAndDeltaRuleAreRowInvariant) {
  {
    const int rows = 16, nh = 8, nkv = 2, hd = 64, first = 40, cap = 64;
    std::vector<float> q = Random(rows * nh * 2 * hd, &rng_, -2, 2);
    std::vector<float> k = Random(cap * nkv * hd, &rng_, -2, 2),
                       v = Random(cap * nkv * hd, &rng_);
    Buffer qb = Up(q), kb = Up(k), vb = Up(v),
           ob = Up(std::vector<float>(rows * nh * hd));
    AttentionParams p;
    p.rows = rows;
    p.num_heads = nh;
    p.num_kv_heads = nkv;
    p.head_dim = hd;
    p.q = qb.f32();
    p.q_row_stride = nh * 2 * hd;
    p.q_head_stride = 2 * hd;
    p.gate = qb.f32() + hd;
    p.gate_row_stride = nh * 2 * hd;
    p.gate_head_stride = 2 * hd;
    p.k_cache = kb.f32();
    p.v_cache = vb.f32();
    p.kv_row_stride = nkv * hd;
    p.capacity = cap;
    p.first_position = first;
    p.out = ob.f32();
    p.out_row_stride = nh * hd;
    p.scale = 0.125f;
    ASSERT_TRUE(backend_->Attention(p).ok());
    const std::vector<float> all = Down(ob, rows * nh * hd);
    for (int t = 0; t < rows; ++t) {
      AttentionParams one = p;
      one.rows = 1;
      one.first_position = first + t;
      one.q = p.q + t * p.q_row_stride;
      one.gate = p.gate + t * p.gate_row_stride;
      Buffer o1 = Up(std::vector<float>(nh * hd));
      one.out = o1.f32();
      ASSERT_TRUE(backend_->Attention(one).ok());
      EXPECT_EQ(0, std::memcmp(Down(o1, nh * hd).data(),
                               all.data() + t * nh * hd, nh * hd * 4))
          << "attention row " << t;
    }
  }
  {
    const int rows = 16, nk = 4, nv = 8, dk = 32, dv = 32;
    const int width = 2 * nk * dk + nv * dv, ssize = nv * dk * dv;
    std::vector<float> qkv = Random(rows * width, &rng_);
    std::vector<float> a = Random(rows * nv, &rng_, -3, 3),
                       b = Random(rows * nv, &rng_, -3, 3);
    std::vector<float> a_log = Random(nv, &rng_, -1, 2), dt = Random(nv, &rng_);
    std::vector<float> st = Random(ssize, &rng_, -0.5, 0.5);
    Buffer qb = Up(qkv), ab = Up(a), bb = Up(b), lb = Up(a_log), db = Up(dt),
           sb = Up(st), ob = Up(std::vector<float>(rows * nv * dv)),
           snaps = Up(std::vector<float>(rows * ssize));
    GatedDeltaRuleParams p;
    p.rows = rows;
    p.num_k_heads = nk;
    p.num_v_heads = nv;
    p.k_head_dim = dk;
    p.v_head_dim = dv;
    p.q = qb.f32();
    p.k = qb.f32() + nk * dk;
    p.v = qb.f32() + 2 * nk * dk;
    p.qkv_stride = width;
    p.a = ab.f32();
    p.b = bb.f32();
    p.ab_stride = nv;
    p.a_log = lb.f32();
    p.dt_bias = db.f32();
    p.state_in = sb.f32();
    p.state_out = snaps.f32();
    p.state_out_stride = ssize;
    p.out = ob.f32();
    p.out_stride = nv * dv;
    ASSERT_TRUE(backend_->GatedDeltaRule(p).ok());
    const std::vector<float> out_all = Down(ob, rows * nv * dv),
                             states = Down(snaps, rows * ssize);
    // Step the same tokens one at a time, in place (the decode path).
    for (int t = 0; t < rows; ++t) {
      GatedDeltaRuleParams one = p;
      one.rows = 1;
      one.q = p.q + t * width;
      one.k = p.k + t * width;
      one.v = p.v + t * width;
      one.a = p.a + t * nv;
      one.b = p.b + t * nv;
      one.state_out = sb.f32();
      one.state_out_stride = 0;
      Buffer o1 = Up(std::vector<float>(nv * dv));
      one.out = o1.f32();
      ASSERT_TRUE(backend_->GatedDeltaRule(one).ok());
      EXPECT_EQ(0, std::memcmp(Down(o1, nv * dv).data(),
                               out_all.data() + t * nv * dv, nv * dv * 4))
          << "gdn out " << t;
      EXPECT_EQ(0, std::memcmp(Down(sb, ssize).data(),
                               states.data() + t * ssize, ssize * 4))
          << "gdn state " << t;
    }
  }
}

// GatedDeltaRuleNormed: the conv (when given), the rule and the gated norm
// of its output heads in turn, bit for bit (outputs, states, and the conv's
// outputs and states); a norm that is not in place over those heads, or a
// conv whose outputs are not the rule's q, k and v, is refused.
TEST_P(BackendOpsTest, GatedDeltaRuleNormedIsTheOpsInTurn) {
  const int rows = 3, nk = 1, nv = 2, dk = 16, dv = 8;
  const int channels = 2 * nk * dk + nv * dv, xw = channels + 3,
            zw = nv * dv + 1;
  const int ssize = nv * dk * dv, csize = channels * 3;
  std::uniform_real_distribution<float> d(-1, 1);
  auto random = [&](int n) {
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  };
  const std::vector<float> raw = random(rows * xw), cw = random(channels * 4),
                           cst = random(csize), ab = random(rows * nv),
                           st = random(ssize), z = random(rows * zw),
                           w = random(dv), coef = random(nv);
  Buffer rb = Up(raw), cwb = Up(cw), abb = Up(ab), cb = Up(coef), zb = Up(z),
         wb = Up(w);
  for (bool conv : {false, true}) {
    std::vector<float> result[2];
    for (bool fused : {false, true}) {
      Buffer sb = Up(st), csb = Up(cst),
             yb = Up(std::vector<float>(rows * channels)),
             ob = Up(std::vector<float>(rows * nv * dv));
      // Without the conv, the raw rows are q, k and v.
      float* const qkv = conv ? yb.f32() : rb.f32();
      GatedDeltaRuleNormParams p;
      if (conv) {
        Conv1dParams& c = p.conv;
        c.rows = rows;
        c.channels = channels;
        c.kernel = 4;
        c.x = rb.f32();
        c.x_stride = xw;
        c.y = yb.f32();
        c.y_stride = channels;
        c.weight = cwb.f32();
        c.state_in = c.state_out = csb.f32();
        c.silu = true;
      }
      GatedDeltaRuleParams& r = p.rule;
      r.rows = rows;
      r.num_k_heads = nk;
      r.num_v_heads = nv;
      r.k_head_dim = dk;
      r.v_head_dim = dv;
      r.q = qkv;
      r.k = qkv + nk * dk;
      r.v = qkv + 2 * nk * dk;
      r.qkv_stride = conv ? channels : xw;
      r.a = r.b = abb.f32();
      r.ab_stride = nv;
      r.a_log = r.dt_bias = cb.f32();
      r.state_in = r.state_out = sb.f32();
      r.out = ob.f32();
      r.out_stride = nv * dv;
      GatedRmsNormParams& n = p.norm;
      n.rows = rows * nv;
      n.dim = dv;
      n.x = n.y = ob.f32();
      n.x_stride = n.y_stride = dv;
      n.z = zb.f32();
      n.z_stride = dv;
      n.z_group = nv;
      n.z_group_stride = zw;
      n.weight = wb.f32();
      if (fused) {
        GatedDeltaRuleNormParams bad = p;
        bad.norm.rows = rows;  // not one vector per output head
        EXPECT_EQ(backend_->GatedDeltaRuleNormed(bad).code(),
                  absl::StatusCode::kInvalidArgument);
        if (conv) {
          bad = p;
          bad.rule.k =
              bad.rule.q;  // k is not the conv's second block of channels
          EXPECT_EQ(backend_->GatedDeltaRuleNormed(bad).code(),
                    absl::StatusCode::kInvalidArgument);
        }
        ASSERT_TRUE(backend_->GatedDeltaRuleNormed(p).ok());
      } else {
        if (conv) {
          ASSERT_TRUE(backend_->Conv1d(p.conv).ok());
        }
        ASSERT_TRUE(backend_->GatedDeltaRule(r).ok());
        ASSERT_TRUE(backend_->GatedRmsNorm(n).ok());
      }
      for (const auto& [buf, size] :
           {std::pair{&ob, rows * nv * dv}, std::pair{&sb, ssize},
            std::pair{&csb, csize}, std::pair{&yb, rows * channels}}) {
        const std::vector<float> v = Down(*buf, size);
        result[fused].insert(result[fused].end(), v.begin(), v.end());
      }
    }
    EXPECT_EQ(result[0], result[1]) << "conv " << conv;
  }
}

TEST_P(BackendOpsTest, SessionBatchMatchesSessionsAlone) {
  ExpectSessionBatchMatchesAlone(backend_.get(), 77);
}

TEST_P(BackendOpsTest, AttentionRejectsRowsPastCapacity) {
  Buffer b = Up(std::vector<float>(64));
  AttentionParams p;
  p.rows = 2;
  p.num_heads = 1;
  p.num_kv_heads = 1;
  p.head_dim = 4;
  p.q = b.f32();
  p.q_row_stride = 4;
  p.q_head_stride = 4;
  p.k_cache = b.f32();
  p.v_cache = b.f32();
  p.kv_row_stride = 4;
  p.capacity = 4;
  p.first_position = 3;
  p.out = b.f32();
  p.out_row_stride = 4;
  EXPECT_EQ(backend_->Attention(p).code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(BackendOpsTest, Conv1dWithSnapshots) {
  for (int rows : kSizes) {
    for (int channels : kSizes) {
      for (int kernel : {2, 4}) {
        const int s = kernel - 1;
        std::vector<float> x = Random(rows * channels, &rng_, -2, 2);
        std::vector<float> w = Random(channels * kernel, &rng_);
        std::vector<float> st = Random(channels * s, &rng_);
        std::vector<double> want_y, want_states;
        reference::Conv1d(rows, channels, kernel, x.data(), w.data(), st.data(),
                          true, &want_y, &want_states);
        Buffer xb = Up(x), wb = Up(w), sb = Up(st),
               yb = Up(std::vector<float>(rows * channels)),
               snaps = Up(std::vector<float>(rows * channels * s));
        Conv1dParams p;
        p.rows = rows;
        p.channels = channels;
        p.kernel = kernel;
        p.x = xb.f32();
        p.x_stride = channels;
        p.y = yb.f32();
        p.y_stride = channels;
        p.weight = wb.f32();
        p.state_in = sb.f32();
        p.state_out = snaps.f32();
        p.state_out_stride = channels * s;
        ASSERT_TRUE(backend_->Conv1d(p).ok());
        const std::vector<float> y_snap = Down(yb, rows * channels);
        ExpectClose(y_snap, want_y, 1e-5, "conv1d y");
        const std::vector<float> got_states = Down(snaps, rows * channels * s);
        ExpectClose(got_states, want_states, 1e-6, "conv1d states");
        // In place, final state only: same outputs, state == last snapshot.
        p.state_out = sb.f32();
        p.state_out_stride = 0;
        ASSERT_TRUE(backend_->Conv1d(p).ok());
        EXPECT_EQ(Down(yb, rows * channels), y_snap);
        const std::vector<float> fin = Down(sb, channels * s);
        EXPECT_EQ(0, std::memcmp(fin.data(),
                                 got_states.data() + (rows - 1) * channels * s,
                                 channels * s * 4));
      }
    }
  }
}

TEST_P(BackendOpsTest, GatedDeltaRuleWithSnapshots) {
  struct Shape {
    int nk, nv, dk, dv;
  };
  for (int rows : kSizes) {
    for (Shape sh : {Shape{1, 1, 1, 1}, Shape{1, 3, 7, 3}, Shape{2, 4, 17, 7},
                     Shape{3, 3, 3, 17}}) {
      const int width = 2 * sh.nk * sh.dk + sh.nv * sh.dv;
      const int ssize = sh.nv * sh.dk * sh.dv;
      std::vector<float> qkv = Random(rows * width, &rng_, -1, 1);
      std::vector<float> a = Random(rows * sh.nv, &rng_, -3, 3),
                         b = Random(rows * sh.nv, &rng_, -3, 3);
      std::vector<float> a_log = Random(sh.nv, &rng_, -1, 2),
                         dt = Random(sh.nv, &rng_);
      std::vector<float> st = Random(ssize, &rng_, -0.5, 0.5);
      std::vector<double> want_out, want_states;
      reference::GatedDeltaRule(rows, sh.nk, sh.nv, sh.dk, sh.dv, qkv.data(),
                                a.data(), b.data(), a_log.data(), dt.data(),
                                st.data(), &want_out, &want_states);
      Buffer qb = Up(qkv), ab = Up(a), bb = Up(b), lb = Up(a_log), db = Up(dt),
             sb = Up(st), ob = Up(std::vector<float>(rows * sh.nv * sh.dv)),
             snaps = Up(std::vector<float>(rows * ssize));
      GatedDeltaRuleParams p;
      p.rows = rows;
      p.num_k_heads = sh.nk;
      p.num_v_heads = sh.nv;
      p.k_head_dim = sh.dk;
      p.v_head_dim = sh.dv;
      p.q = qb.f32();
      p.k = qb.f32() + sh.nk * sh.dk;
      p.v = qb.f32() + 2 * sh.nk * sh.dk;
      p.qkv_stride = width;
      p.a = ab.f32();
      p.b = bb.f32();
      p.ab_stride = sh.nv;
      p.a_log = lb.f32();
      p.dt_bias = db.f32();
      p.state_in = sb.f32();
      p.state_out = snaps.f32();
      p.state_out_stride = ssize;
      p.out = ob.f32();
      p.out_stride = sh.nv * sh.dv;
      ASSERT_TRUE(backend_->GatedDeltaRule(p).ok());
      const std::vector<float> out_snap = Down(ob, rows * sh.nv * sh.dv);
      ExpectClose(out_snap, want_out, 1e-5, "gdn out");
      const std::vector<float> got_states = Down(snaps, rows * ssize);
      ExpectClose(got_states, want_states, 1e-5, "gdn states");
      // In place: identical outputs and final state.
      p.state_out = sb.f32();
      p.state_out_stride = 0;
      ASSERT_TRUE(backend_->GatedDeltaRule(p).ok());
      EXPECT_EQ(Down(ob, rows * sh.nv * sh.dv), out_snap);
      EXPECT_EQ(0,
                std::memcmp(Down(sb, ssize).data(),
                            got_states.data() + (rows - 1) * ssize, ssize * 4));
    }
  }
}

float WidenBf16(uint16_t h) {
  const uint32_t b = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// A bf16 recurrent state (GatedDeltaRuleParams state_dtype): each token's
// state is the fp32 rule's one-token update of the widened state before
// it, rounded to nearest even, and its output is that fp32 update's
// output; a T-token call (snapshots, or in place) equals T one-token calls
// bit for bit. With fp32 storage (the default) nothing changes: explicitly
// kF32 gives the default's bits.
TEST_P(BackendOpsTest, Bf16RecurrentStateRoundsEveryToken) {
  struct Shape {
    int nk, nv, dk, dv;
  };
  for (const Shape sh : {Shape{2, 4, 32, 32}, Shape{1, 3, 16, 8}}) {
    const int rows = 9;
    const int width = 2 * sh.nk * sh.dk + sh.nv * sh.dv;
    const int ssize = sh.nv * sh.dk * sh.dv, osize = sh.nv * sh.dv;
    const std::vector<float> qkv = Random(rows * width, &rng_);
    const std::vector<float> a = Random(rows * sh.nv, &rng_, -3, 3),
                             b = Random(rows * sh.nv, &rng_, -3, 3);
    const std::vector<float> a_log = Random(sh.nv, &rng_, -1, 2),
                             dt = Random(sh.nv, &rng_);
    std::vector<uint16_t> st16(ssize);
    {
      const std::vector<float> st = Random(ssize, &rng_, -0.5, 0.5);
      for (int i = 0; i < ssize; ++i) st16[i] = NearestBf16(st[i]);
    }
    Buffer qb = Up(qkv), ab = Up(a), bb = Up(b), lb = Up(a_log), db = Up(dt);
    GatedDeltaRuleParams p;
    p.rows = rows;
    p.num_k_heads = sh.nk;
    p.num_v_heads = sh.nv;
    p.k_head_dim = sh.dk;
    p.v_head_dim = sh.dv;
    p.q = qb.f32();
    p.k = qb.f32() + sh.nk * sh.dk;
    p.v = qb.f32() + 2 * sh.nk * sh.dk;
    p.qkv_stride = width;
    p.a = ab.f32();
    p.b = bb.f32();
    p.ab_stride = sh.nv;
    p.a_log = lb.f32();
    p.dt_bias = db.f32();
    p.out_stride = osize;
    p.state_dtype = DType::kBF16;
    auto one_token = [&](const GatedDeltaRuleParams& base, int t) {
      GatedDeltaRuleParams one = base;
      one.rows = 1;
      one.q = base.q + t * width;
      one.k = base.k + t * width;
      one.v = base.v + t * width;
      one.a = base.a + t * sh.nv;
      one.b = base.b + t * sh.nv;
      one.state_out_stride = 0;
      return one;
    };

    // All tokens in one call, a bf16 snapshot per token.
    Buffer sb = UpRaw(st16.data(), ssize * 2),
           ob = Up(std::vector<float>(rows * osize)),
           snaps = UpRaw(std::vector<uint16_t>(rows * ssize).data(),
                         rows * ssize * 2);
    GatedDeltaRuleParams all = p;
    all.state_in = sb.data();
    all.state_out = snaps.data();
    all.state_out_stride = ssize;
    all.out = ob.f32();
    ASSERT_TRUE(backend_->GatedDeltaRule(all).ok());
    const std::vector<float> out_all = Down(ob, rows * osize);
    std::vector<uint16_t> snap16(rows * ssize);
    ASSERT_TRUE(
        backend_->CopyToHost(snap16.data(), snaps.data(), snap16.size() * 2)
            .ok());

    // Token by token: bf16 in place (decode), and the fp32 rule from the
    // widened state before each token (the reference for the rounding).
    std::vector<uint16_t> prev = st16;
    for (int t = 0; t < rows; ++t) {
      const std::string what =
          "dk=" + std::to_string(sh.dk) + " token " + std::to_string(t);
      Buffer o1 = Up(std::vector<float>(osize));
      GatedDeltaRuleParams one = one_token(p, t);
      one.state_in = one.state_out = sb.data();
      one.out = o1.f32();
      ASSERT_TRUE(backend_->GatedDeltaRule(one).ok());
      std::vector<uint16_t> now(ssize);
      ASSERT_TRUE(backend_->CopyToHost(now.data(), sb.data(), ssize * 2).ok());
      EXPECT_EQ(0,
                std::memcmp(now.data(), snap16.data() + t * ssize, ssize * 2))
          << what << ": state, one call vs token by token";
      const std::vector<float> out1 = Down(o1, osize);
      EXPECT_EQ(0,
                std::memcmp(out1.data(), out_all.data() + t * osize, osize * 4))
          << what << ": output, one call vs token by token";

      std::vector<float> wide(ssize);
      for (int i = 0; i < ssize; ++i) wide[i] = WidenBf16(prev[i]);
      Buffer f32 = Up(wide), of = Up(std::vector<float>(osize));
      GatedDeltaRuleParams ref = one_token(p, t);
      ref.state_dtype = DType::kF32;
      ref.state_in = ref.state_out = f32.data();
      ref.out = of.f32();
      ASSERT_TRUE(backend_->GatedDeltaRule(ref).ok());
      const std::vector<float> next = Down(f32, ssize);
      for (int i = 0; i < ssize; ++i) {
        ASSERT_EQ(now[i], NearestBf16(next[i]))
            << what << ": element " << i << " is not the fp32 update rounded";
      }
      EXPECT_EQ(Down(of, osize), out1) << what << ": output of the fp32 update";
      prev = now;
    }

    // In place over all tokens: the last snapshot, the same outputs.
    Buffer sb2 = UpRaw(st16.data(), ssize * 2),
           ob2 = Up(std::vector<float>(rows * osize));
    GatedDeltaRuleParams inplace = p;
    inplace.state_in = inplace.state_out = sb2.data();
    inplace.out = ob2.f32();
    ASSERT_TRUE(backend_->GatedDeltaRule(inplace).ok());
    std::vector<uint16_t> last(ssize);
    ASSERT_TRUE(backend_->CopyToHost(last.data(), sb2.data(), ssize * 2).ok());
    EXPECT_EQ(0, std::memcmp(last.data(), snap16.data() + (rows - 1) * ssize,
                             ssize * 2));
    EXPECT_EQ(Down(ob2, rows * osize), out_all);

    // fp32 storage: explicitly kF32 gives the default's bits.
    std::vector<float> wide(ssize);
    for (int i = 0; i < ssize; ++i) wide[i] = WidenBf16(st16[i]);
    Buffer s_def = Up(wide), s_f32 = Up(wide),
           o_def = Up(std::vector<float>(rows * osize)),
           o_f32 = Up(std::vector<float>(rows * osize));
    GatedDeltaRuleParams def = p, f32 = p;
    def.state_dtype = GatedDeltaRuleParams{}.state_dtype;
    EXPECT_EQ(def.state_dtype, DType::kF32) << "fp32 is the default";
    def.state_in = def.state_out = s_def.data();
    def.out = o_def.f32();
    f32.state_dtype = DType::kF32;
    f32.state_in = f32.state_out = s_f32.data();
    f32.out = o_f32.f32();
    ASSERT_TRUE(backend_->GatedDeltaRule(def).ok());
    ASSERT_TRUE(backend_->GatedDeltaRule(f32).ok());
    EXPECT_EQ(Down(s_def, ssize), Down(s_f32, ssize));
    EXPECT_EQ(Down(o_def, rows * osize), Down(o_f32, rows * osize));

    GatedDeltaRuleParams bad = inplace;
    bad.state_dtype = DType::kF16;
    EXPECT_EQ(backend_->GatedDeltaRule(bad).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST_P(BackendOpsTest, SwigluEmbedReduce) {
  for (int n : kSizes) {
    std::vector<float> g = Random(n, &rng_, -4, 4), u = Random(n, &rng_);
    Buffer gb = Up(g), ub = Up(u), ob = Up(std::vector<float>(n));
    SwigluParams p;
    p.rows = 1;
    p.dim = n;
    p.gate = gb.f32();
    p.gate_stride = n;
    p.up = ub.f32();
    p.up_stride = n;
    p.out = ob.f32();
    p.out_stride = n;
    ASSERT_TRUE(backend_->Swiglu(p).ok());
    ExpectClose(Down(ob, n), reference::Swiglu(n, g.data(), u.data()), 1e-6,
                "swiglu");
  }
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const int vocab = 17, dim = 7;
    std::vector<float> tf = Random(vocab * dim, &rng_);
    std::vector<uint16_t> th = RandomHalf(vocab * dim, dtype, &rng_);
    const void* table =
        dtype == DType::kF32 ? static_cast<const void*>(tf.data()) : th.data();
    Buffer tb = UpRaw(table, vocab * dim * DTypeSize(dtype));
    std::vector<int32_t> ids = {3, 0, 16};
    Buffer ib = UpRaw(ids.data(), ids.size() * 4);
    Buffer ob = Up(std::vector<float>(3 * dim));
    EmbedParams p;
    p.rows = 3;
    p.ids = static_cast<const int32_t*>(ib.data());
    p.table_dtype = dtype;
    p.table = tb.data();
    p.vocab = vocab;
    p.dim = dim;
    p.out = ob.f32();
    p.out_stride = dim;
    ASSERT_TRUE(backend_->Embed(p).ok());
    std::vector<double> want;
    for (int id : ids) {
      for (int i = 0; i < dim; ++i)
        want.push_back(reference::WeightAt(dtype, table, id * dim + i));
    }
    ExpectClose(Down(ob, 3 * dim), want, 0, "embed");
  }
  for (int rows : kSizes) {
    for (int cols : kSizes) {
      std::vector<float> x = Random(rows * cols, &rng_, -10, 10);
      Buffer xb = Up(x), ob = Up(std::vector<float>(rows * cols));
      Buffer ab = UpRaw(std::vector<int32_t>(rows).data(), rows * 4);
      ArgmaxParams am;
      am.rows = rows;
      am.cols = cols;
      am.x = xb.f32();
      am.x_stride = cols;
      am.out = static_cast<int32_t*>(ab.data());
      ASSERT_TRUE(backend_->Argmax(am).ok());
      std::vector<int32_t> got(rows);
      ASSERT_TRUE(backend_->CopyToHost(got.data(), ab.data(), rows * 4).ok());
      for (int r = 0; r < rows; ++r) {
        int best = 0;
        for (int i = 1; i < cols; ++i)
          if (x[r * cols + i] > x[r * cols + best]) best = i;
        EXPECT_EQ(got[r], best);
      }
      LogSumExpParams lp;
      lp.rows = rows;
      lp.cols = cols;
      lp.x = xb.f32();
      lp.x_stride = cols;
      lp.out = ob.f32();
      lp.inv_temperature = 0.7f;
      ASSERT_TRUE(backend_->LogSumExp(lp).ok());
      ExpectClose(Down(ob, rows),
                  reference::LogSumExp(rows, cols, x.data(), 0.7f), 1e-5,
                  "lse");
      SoftmaxParams sp;
      sp.rows = rows;
      sp.cols = cols;
      sp.x = xb.f32();
      sp.x_stride = cols;
      sp.y = ob.f32();
      sp.y_stride = cols;
      sp.inv_temperature = 0.7f;
      ASSERT_TRUE(backend_->Softmax(sp).ok());
      ExpectClose(Down(ob, rows * cols),
                  reference::Softmax(rows, cols, x.data(), 0.7f), 1e-5,
                  "softmax");
    }
  }
}

// Argmax's finiteness flag: a NaN or ±inf anywhere in a row (first, last or
// middle column, past a block's first stride) clears it; the argmax keeps the
// CPU loop's rule (NaN never wins except at index 0).
TEST_P(BackendOpsTest, ArgmaxFlagsRowsWithNonFiniteValues) {
  const int cols = 3000;
  const float kInf = std::numeric_limits<float>::infinity();
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  struct Row {
    int at;  // column of the bad value, -1 for none
    float bad;
  };
  const std::vector<Row> rows = {{-1, 0},      {0, kNaN},    {2999, kNaN},
                                 {1234, kInf}, {777, -kInf}, {-1, 0}};
  const int n = static_cast<int>(rows.size());
  std::vector<float> x = Random(n * cols, &rng_, -10, 10);
  for (int r = 0; r < n; ++r) {
    if (rows[r].at >= 0) x[r * cols + rows[r].at] = rows[r].bad;
  }
  Buffer xb = Up(x);
  Buffer ab = UpRaw(std::vector<int32_t>(n).data(), n * 4);
  Buffer fb = UpRaw(std::vector<int32_t>(n, 7).data(), n * 4);
  ArgmaxParams am;
  am.rows = n;
  am.cols = cols;
  am.x = xb.f32();
  am.x_stride = cols;
  am.out = static_cast<int32_t*>(ab.data());
  am.finite = static_cast<int32_t*>(fb.data());
  ASSERT_TRUE(backend_->Argmax(am).ok());
  std::vector<int32_t> got(n), finite(n);
  ASSERT_TRUE(backend_->CopyToHost(got.data(), ab.data(), n * 4).ok());
  ASSERT_TRUE(backend_->CopyToHost(finite.data(), fb.data(), n * 4).ok());
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(finite[r], rows[r].at < 0 ? 1 : 0) << "row " << r;
    int best = 0;
    for (int i = 1; i < cols; ++i) {
      if (x[r * cols + i] > x[r * cols + best]) best = i;
    }
    EXPECT_EQ(got[r], best) << "row " << r;
  }
}

TEST_P(BackendOpsTest, EmbedRejectsOutOfRangeIds) {
  std::vector<float> table(4 * 2, 1.0f);
  Buffer tb = Up(table), ob = Up(std::vector<float>(2));
  const int32_t bad = 4;
  Buffer ib = UpRaw(&bad, 4);
  EmbedParams p;
  p.rows = 1;
  p.ids = static_cast<const int32_t*>(ib.data());
  p.table = tb.data();
  p.vocab = 4;
  p.dim = 2;
  p.out = ob.f32();
  p.out_stride = 2;
  EXPECT_FALSE(backend_->Embed(p).ok());
}

// The CPU kernels read row-major weights only: a weight another backend put
// in its own layout (the CUDA tensor-core tiles) is refused, not misread.
// (kernels/cuda/cuda_backend_test.cc: WeightLayouts checks the CUDA side.)
TEST_P(BackendOpsTest, CpuRefusesWeightsInAnotherLayout) {
  std::vector<float> x(8, 1.0f);
  std::vector<uint16_t> w(8 * 8, 0x3f80);  // bf16 1.0
  Buffer xb = Up(x), yb = Up(std::vector<float>(8)),
         wb = UpRaw(w.data(), w.size() * 2);
  MatmulParams m;
  m.rows = 1;
  m.in = m.out = 8;
  m.x = xb.f32();
  m.x_stride = 8;
  m.w_dtype = DType::kBF16;
  m.w = wb.data();
  m.y = yb.f32();
  m.y_stride = 8;
  ASSERT_TRUE(backend_->Matmul(m).ok());
  m.w_layout = WeightLayout::kTensorCoreTiles;
  const absl::Status s = backend_->Matmul(m);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("row-major"), std::string::npos) << s;
  const int32_t id = 1;
  Buffer ib = UpRaw(&id, 4);
  EmbedParams e;
  e.rows = 1;
  e.ids = static_cast<const int32_t*>(ib.data());
  e.table_dtype = DType::kBF16;
  e.table_layout = WeightLayout::kTensorCoreTiles;
  e.table = wb.data();
  e.vocab = e.dim = 8;
  e.out = yb.f32();
  e.out_stride = 8;
  EXPECT_EQ(backend_->Embed(e).code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, BackendOpsTest,
                         ::testing::Range(0,
                                          static_cast<int>(Backends().size())),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return Backends()[info.param].name;
                         });

}  // namespace
}  // namespace specserve::kernels
