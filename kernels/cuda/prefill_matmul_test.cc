// The prefill matmul (prefill_matmul.cu) through CudaBackend::PrefillMatmul:
// against a double reference from the same bf16 x' (x after its fused
// RmsNorm or SwiGLU as the exact ops compute it on the GPU, rounded to
// bf16) and the bf16 weights, within 1e-4 of max |y| (only the fp32
// accumulation order differs); against the CPU backend's exact Matmul
// within the prefill tolerance, 2e-2 of max |y|; bit-exact row invariance
// (one call of 600 rows against the same rows in calls of 1, 16, 17, 128,
// 455, and a row against changed neighbours); determinism; which weights it
// applies to. Its speed is tools/cuda_bench/prefill_ops_bench's. Every test
// skips when no CUDA device is visible.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/ops.h"
#include "kernels/matmul.h"

namespace specserve::kernels::cuda {
namespace {

// fp32 -> bf16 bits, round to nearest even (the inputs here are finite).
uint16_t Bf16Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

float Bf16Value(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// What a fused matmul reads in front of its product.
enum class Fuse { kNone, kNorm, kSwiglu };

struct Case {
  int64_t rows = 1, in = 8, out = 1;
  bool accumulate = false;
  Fuse fuse = Fuse::kNone;
  bool plus_one = true;
  int64_t x_pad = 0;     // x_stride beyond what the fused op needs
  int64_t y_pad = 0;     // y_stride beyond out (columns that stay untouched)
  int64_t x_offset = 0;  // floats into x's buffer (1: no 16-byte loads)

  std::string Name() const {
    return absl::StrCat("T=", rows, " in=", in, " out=", out,
                        " acc=", accumulate, " fuse=", static_cast<int>(fuse),
                        " plus_one=", plus_one, " x_pad=", x_pad,
                        " y_pad=", y_pad, " x_offset=", x_offset);
  }
  int64_t XStride() const {
    return (fuse == Fuse::kSwiglu ? 2 * in : in) + x_pad;
  }
  int64_t YStride() const { return out + y_pad; }
};

class PrefillMatmulTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
    auto b = CreateCudaBackend(0);
    ASSERT_TRUE(b.ok()) << b.status();
    gpu_ = std::move(*b);
    cpu_ = std::make_unique<cpu::CpuBackend>();
  }

  std::vector<float> Random(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng_);
    return v;
  }
  std::vector<uint16_t> RandomBf16(size_t n) {
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    std::vector<uint16_t> v(n);
    for (uint16_t& h : v) h = Bf16Bits(d(rng_));
    return v;
  }

  Buffer Up(Backend* b, const void* data, size_t bytes) {
    auto buf = b->Allocate(bytes);
    EXPECT_TRUE(buf.ok()) << buf.status();
    if (bytes > 0) {
      EXPECT_TRUE(b->CopyToDevice(buf->data(), data, bytes).ok());
    }
    return std::move(*buf);
  }
  Buffer UpF(Backend* b, const std::vector<float>& v) {
    return Up(b, v.data(), v.size() * sizeof(float));
  }
  std::vector<float> Down(Backend* b, const float* src, size_t n) {
    std::vector<float> v(n);
    EXPECT_TRUE(b->CopyToHost(v.data(), src, n * sizeof(float)).ok());
    return v;
  }

  // The inputs of one case, on one backend.
  struct Inputs {
    Buffer x, y, norm;
    Weight w;
  };
  Inputs Upload(Backend* b, const Case& c, const std::vector<float>& x,
                const std::vector<float>& y0, const std::vector<float>& norm,
                const std::vector<uint16_t>& w) {
    Inputs in;
    in.x = UpF(b, x);
    in.y = UpF(b, y0);
    if (c.fuse == Fuse::kNorm) in.norm = UpF(b, norm);
    auto wt = b->UploadWeight(DType::kBF16, w.data(), c.out, c.in);
    EXPECT_TRUE(wt.ok()) << wt.status();
    in.w = std::move(*wt);
    return in;
  }
  static MatmulParams ParamsOf(const Case& c, const Inputs& in) {
    MatmulParams p = DenseMatmul(c.rows, in.x.f32() + c.x_offset, in.w,
                                 in.y.f32(), c.accumulate);
    p.out = c.out;
    p.x_stride = c.XStride();
    p.y_stride = c.YStride();
    if (c.fuse == Fuse::kNorm) {
      p.norm_weight = in.norm.f32();
      p.norm_plus_one = c.plus_one;
      p.norm_eps = 1e-6f;
    }
    p.swiglu = c.fuse == Fuse::kSwiglu;
    return p;
  }

  // x' as the exact ops give it on the GPU, rounded to bf16: [rows][in].
  std::vector<float> RoundedXPrime(const Case& c, const MatmulParams& p) {
    const size_t n = static_cast<size_t>(c.rows * c.in);
    std::vector<float> xp(n);
    if (c.fuse == Fuse::kNone) {
      const std::vector<float> x =
          Down(gpu_.get(), p.x, static_cast<size_t>(c.rows * p.x_stride));
      for (int64_t t = 0; t < c.rows; ++t) {
        std::copy(x.begin() + t * p.x_stride, x.begin() + t * p.x_stride + c.in,
                  xp.begin() + t * c.in);
      }
    } else {
      auto dense = gpu_->Allocate(n * sizeof(float));
      EXPECT_TRUE(dense.ok());
      const absl::Status s = c.fuse == Fuse::kNorm
                                 ? gpu_->RmsNorm(FusedNormOf(p, dense->f32()))
                                 : gpu_->Swiglu(FusedSwigluOf(p, dense->f32()));
      EXPECT_TRUE(s.ok()) << s;
      xp = Down(gpu_.get(), dense->f32(), n);
    }
    for (float& v : xp) v = Bf16Value(Bf16Bits(v));
    return xp;
  }

  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<Backend> cpu_;
  std::mt19937 rng_{20250611};
};

// ref[t][o] = y0 (when accumulating) + Σ_k x'[t][k]·W[o][k], in double,
// rows spread over the host's threads.
std::vector<double> Reference(const Case& c, const std::vector<float>& xp,
                              const std::vector<uint16_t>& w,
                              const std::vector<float>& y0) {
  std::vector<float> wf(w.size());
  for (size_t i = 0; i < w.size(); ++i) wf[i] = Bf16Value(w[i]);
  std::vector<double> ref(static_cast<size_t>(c.rows * c.out));
  const int threads =
      std::max(1, std::min<int>(16, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int th = 0; th < threads; ++th) {
    pool.emplace_back([&, th] {
      for (int64_t t = th; t < c.rows; t += threads) {
        const float* x = xp.data() + t * c.in;
        for (int64_t o = 0; o < c.out; ++o) {
          const float* wr = wf.data() + o * c.in;
          double s = 0.0;
          for (int64_t k = 0; k < c.in; ++k) s += double(x[k]) * double(wr[k]);
          if (c.accumulate) s += y0[t * c.YStride() + o];
          ref[t * c.out + o] = s;
        }
      }
    });
  }
  for (std::thread& th : pool) th.join();
  return ref;
}

// max |got − want| <= tol · max |want| over the case's outputs; no NaN.
void ExpectClose(const Case& c, const std::vector<float>& got,
                 const std::vector<double>& want, double tol,
                 const std::string& what) {
  double scale = 0.0, worst = 0.0;
  int64_t worst_i = 0;
  for (double v : want) scale = std::max(scale, std::fabs(v));
  for (int64_t t = 0; t < c.rows; ++t) {
    for (int64_t o = 0; o < c.out; ++o) {
      const float g = got[t * c.YStride() + o];
      ASSERT_FALSE(std::isnan(g)) << what << ": NaN at t=" << t << " o=" << o;
      const double d = std::fabs(double(g) - want[t * c.out + o]);
      if (d > worst) worst = d, worst_i = t * c.out + o;
    }
  }
  EXPECT_LE(worst, tol * std::max(scale, 1e-30))
      << what << ": worst at t=" << worst_i / c.out << " o=" << worst_i % c.out
      << " (max |y| " << scale << ")";
}

// ---------------------------------------------------------- correctness

TEST_F(PrefillMatmulTest, MatchesReferenceAndExactMatmul) {
  const int64_t kOuts[] = {1, 100, 128, 300, 1000};
  const int64_t kIns[] = {8, 64, 256, 776, 5120};
  const int64_t kTs[] = {1, 3, 64, 130, 600};
  constexpr int kModes = 7;
  int index = 0;
  for (int64_t out : kOuts) {
    for (int64_t in : kIns) {
      for (int64_t rows : kTs) {
        Case c;
        c.rows = rows;
        c.in = in;
        c.out = out;
        // Every mode meets every size across the sweep.
        switch ((index++) % kModes) {
          case 0:
            break;
          case 1:
            c.accumulate = true;
            break;
          case 2:
            c.fuse = Fuse::kNorm;
            c.plus_one = true;
            break;
          case 3:
            c.fuse = Fuse::kNorm;
            c.plus_one = false;
            c.accumulate = true;
            c.y_pad = 5;
            break;
          case 4:
            c.fuse = Fuse::kSwiglu;
            break;
          case 5:  // strided, misaligned x (scalar loads), padded y
            c.accumulate = true;
            c.x_pad = 3;
            c.x_offset = 1;
            c.y_pad = 7;
            break;
          case 6:
            c.fuse = Fuse::kSwiglu;
            c.accumulate = true;
            c.x_pad = 8;
            c.y_pad = 3;
            break;
        }
        const std::string what = c.Name();
        std::vector<float> x = Random(
            static_cast<size_t>(c.rows * c.XStride() + c.x_offset), -2, 2);
        const std::vector<float> y0 =
            Random(static_cast<size_t>(c.rows * c.YStride()));
        const std::vector<float> norm =
            c.plus_one ? Random(c.in, -0.5f, 0.5f) : Random(c.in, 0.5f, 1.5f);
        const std::vector<uint16_t> w = RandomBf16(c.out * c.in);

        Inputs g = Upload(gpu_.get(), c, x, y0, norm, w);
        ASSERT_EQ(g.w.layout, WeightLayout::kTensorCoreTiles) << what;
        const MatmulParams pg = ParamsOf(c, g);
        ASSERT_TRUE(PrefillMatmulApplies(pg)) << what;
        const std::vector<float> xp = RoundedXPrime(c, pg);
        ASSERT_TRUE(gpu_->PrefillMatmul(pg).ok()) << what;
        const std::vector<float> got = Down(gpu_.get(), pg.y, y0.size());

        ExpectClose(c, got, Reference(c, xp, w, y0), 1e-4, what + " vs ref");
        // The padding columns of y are never written.
        for (int64_t t = 0; t < c.rows; ++t) {
          for (int64_t o = c.out; o < c.YStride(); ++o) {
            ASSERT_EQ(got[t * c.YStride() + o], y0[t * c.YStride() + o])
                << what << ": padding written at t=" << t << " o=" << o;
          }
        }

        Inputs h = Upload(cpu_.get(), c, x, y0, norm, w);
        const MatmulParams pc = ParamsOf(c, h);
        ASSERT_TRUE(cpu_->Matmul(pc).ok()) << what;
        const std::vector<float> exact = Down(cpu_.get(), pc.y, y0.size());
        std::vector<double> exact_d(static_cast<size_t>(c.rows * c.out));
        for (int64_t t = 0; t < c.rows; ++t) {
          for (int64_t o = 0; o < c.out; ++o) {
            exact_d[t * c.out + o] = exact[t * c.YStride() + o];
          }
        }
        ExpectClose(c, got, exact_d, 2e-2, what + " vs exact cpu");
        if (HasFatalFailure() || HasFailure()) return;
      }
    }
  }
}

// ------------------------------------------------- row invariance, bits

// One call of 600 rows, then the same rows in calls of `chunk` rows: the
// same bits (memcmp over all of y); then the other rows' x changed: rows
// kept keep their bits. Shapes chosen so that the calls take different
// token tiles (8 .. 256) and so different grids.
TEST_F(PrefillMatmulTest, RowInvariantBitForBit) {
  struct Shape {
    int64_t in, out;
    Fuse fuse;
    bool accumulate;
  };
  const Shape kShapes[] = {{1024, 33000, Fuse::kNorm, false},
                           {776, 5120, Fuse::kSwiglu, true},
                           {256, 1000, Fuse::kNone, true}};
  for (const Shape& sh : kShapes) {
    Case c;
    c.rows = 600;
    c.in = sh.in;
    c.out = sh.out;
    c.fuse = sh.fuse;
    c.accumulate = sh.accumulate;
    const std::string what = c.Name();
    std::vector<float> x =
        Random(static_cast<size_t>(c.rows * c.XStride()), -2, 2);
    const std::vector<float> y0 =
        Random(static_cast<size_t>(c.rows * c.YStride()));
    const std::vector<float> norm = Random(c.in, -0.5f, 0.5f);
    const std::vector<uint16_t> w = RandomBf16(c.out * c.in);
    Inputs g = Upload(gpu_.get(), c, x, y0, norm, w);
    const MatmulParams p = ParamsOf(c, g);
    ASSERT_TRUE(gpu_->PrefillMatmul(p).ok()) << what;
    const std::vector<float> whole = Down(gpu_.get(), p.y, y0.size());

    for (int64_t chunk : {1, 16, 17, 128, 455}) {
      ASSERT_TRUE(
          gpu_->CopyToDevice(g.y.data(), y0.data(), y0.size() * 4).ok());
      for (int64_t t0 = 0; t0 < c.rows; t0 += chunk) {
        MatmulParams pc = p;
        pc.rows = std::min(chunk, c.rows - t0);
        pc.x = p.x + t0 * p.x_stride;
        pc.y = p.y + t0 * p.y_stride;
        ASSERT_TRUE(gpu_->PrefillMatmul(pc).ok()) << what;
      }
      const std::vector<float> parts = Down(gpu_.get(), p.y, y0.size());
      EXPECT_EQ(0, std::memcmp(whole.data(), parts.data(), whole.size() * 4))
          << what << ": chunks of " << chunk << " differ from one call";
    }

    // Neighbours changed: rows 0, 255 and 599 keep their bits.
    const int64_t kKept[] = {0, 255, 599};
    std::vector<float> x2 =
        Random(static_cast<size_t>(c.rows * c.XStride()), -3, 3);
    for (int64_t r : kKept) {
      std::copy(x.begin() + r * c.XStride(), x.begin() + (r + 1) * c.XStride(),
                x2.begin() + r * c.XStride());
    }
    ASSERT_TRUE(gpu_->CopyToDevice(g.x.data(), x2.data(), x2.size() * 4).ok());
    ASSERT_TRUE(gpu_->CopyToDevice(g.y.data(), y0.data(), y0.size() * 4).ok());
    ASSERT_TRUE(gpu_->PrefillMatmul(p).ok()) << what;
    const std::vector<float> moved = Down(gpu_.get(), p.y, y0.size());
    for (int64_t r : kKept) {
      EXPECT_EQ(0, std::memcmp(whole.data() + r * c.YStride(),
                               moved.data() + r * c.YStride(), c.out * 4))
          << what << ": row " << r << " depends on its neighbours";
    }
  }
}

TEST_F(PrefillMatmulTest, Deterministic) {
  Case c;
  c.rows = 2048;
  c.in = 5120;
  c.out = 5120;
  c.fuse = Fuse::kNorm;
  const std::vector<float> x =
      Random(static_cast<size_t>(c.rows * c.XStride()), -2, 2);
  const std::vector<float> y0(static_cast<size_t>(c.rows * c.YStride()), 0.0f);
  const std::vector<float> norm = Random(c.in, -0.5f, 0.5f);
  const std::vector<uint16_t> w = RandomBf16(c.out * c.in);
  Inputs g = Upload(gpu_.get(), c, x, y0, norm, w);
  const MatmulParams p = ParamsOf(c, g);
  std::vector<float> runs[2];
  for (std::vector<float>& r : runs) {
    ASSERT_TRUE(gpu_->PrefillMatmul(p).ok());
    r = Down(gpu_.get(), p.y, y0.size());
  }
  EXPECT_EQ(0, std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * 4));
}

// ------------------------------------------------------------- applies

TEST_F(PrefillMatmulTest, AppliesToTiledBf16Only) {
  Case c;
  c.rows = 5;
  c.in = 64;
  c.out = 40;
  const std::vector<float> x = Random(c.rows * c.in);
  const std::vector<float> y0(c.rows * c.out, 0.0f);
  const std::vector<uint16_t> wb = RandomBf16(c.out * c.in);
  Inputs tiled = Upload(gpu_.get(), c, x, y0, {}, wb);
  EXPECT_TRUE(PrefillMatmulApplies(ParamsOf(c, tiled)));

  MatmulParams bad = ParamsOf(c, tiled);
  bad.rows = 0;
  EXPECT_FALSE(PrefillMatmulApplies(bad)) << "invalid params";

  const std::vector<float> wf = Random(c.out * c.in);
  auto f32 = gpu_->UploadWeight(DType::kF32, wf.data(), c.out, c.in);
  ASSERT_TRUE(f32.ok());
  MatmulParams pf = DenseMatmul(c.rows, tiled.x.f32(), *f32, tiled.y.f32());
  EXPECT_FALSE(PrefillMatmulApplies(pf)) << "fp32 weights";

  // bf16 kept row-major (cols % 8 != 0): not for the kernel, and the
  // backend's PrefillMatmul is then its exact Matmul, bit for bit.
  ASSERT_FALSE(TilesForTensorCores(DType::kBF16, 12));
  const std::vector<uint16_t> w12 = RandomBf16(c.out * 12);
  auto rm = gpu_->UploadWeight(DType::kBF16, w12.data(), c.out, 12);
  ASSERT_TRUE(rm.ok());
  ASSERT_EQ(rm->layout, WeightLayout::kRowMajor);
  MatmulParams pr = DenseMatmul(c.rows, tiled.x.f32(), *rm, tiled.y.f32());
  EXPECT_FALSE(PrefillMatmulApplies(pr)) << "row-major bf16";
  ASSERT_TRUE(gpu_->PrefillMatmul(pr).ok());
  const std::vector<float> prefill = Down(gpu_.get(), pr.y, c.rows * c.out);
  ASSERT_TRUE(gpu_->Matmul(pr).ok());
  const std::vector<float> exact = Down(gpu_.get(), pr.y, c.rows * c.out);
  EXPECT_EQ(0, std::memcmp(prefill.data(), exact.data(), exact.size() * 4));

  // A backend with the tensor cores off keeps bf16 row-major too.
  CudaBackendOptions options;
  options.matmul_x_splits = 0;
  auto plain = CreateCudaBackend(options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto wp = (*plain)->UploadWeight(DType::kBF16, wb.data(), c.out, c.in);
  ASSERT_TRUE(wp.ok());
  EXPECT_EQ(wp->layout, WeightLayout::kRowMajor);
  auto xb = (*plain)->Allocate(x.size() * 4);
  auto yb = (*plain)->Allocate(y0.size() * 4);
  ASSERT_TRUE(xb.ok() && yb.ok());
  EXPECT_FALSE(
      PrefillMatmulApplies(DenseMatmul(c.rows, xb->f32(), *wp, yb->f32())));
}

}  // namespace
}  // namespace specserve::kernels::cuda
