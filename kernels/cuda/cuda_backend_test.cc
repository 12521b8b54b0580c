// The CUDA backend against the CPU backend (the oracle), op by op, over odd
// shapes (T = 1, 3, 7, 17, ...; dims that are not multiples of any tile;
// bf16/f16/f32 weights) with a per-op tolerance and a NaN check, plus the
// exactness contract on the GPU: an op over T rows is bit-identical (memcmp)
// to the same rows issued one at a time. Every test skips when no CUDA
// device is visible.
#include "kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/ops.h"
#include "kernels/session_batch_check.h"

namespace specserve::kernels::cuda {
namespace {

// The same bytes on both backends.
struct Dual {
  Buffer c, g;
  size_t bytes = 0;
  float* F(bool gpu) const { return (gpu ? g : c).f32(); }
  void* V(bool gpu) const { return (gpu ? g : c).data(); }
};

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
    auto b = CreateCudaBackend(0);
    ASSERT_TRUE(b.ok()) << b.status();
    gpu_ = std::move(*b);
    cpu_ = std::make_unique<cpu::CpuBackend>();
  }

  Backend* B(bool gpu) { return gpu ? gpu_.get() : cpu_.get(); }

  Dual Up(const void* data, size_t bytes) {
    Dual d;
    d.bytes = bytes;
    auto c = cpu_->Allocate(bytes);
    auto g = gpu_->Allocate(bytes);
    EXPECT_TRUE(c.ok() && g.ok());
    d.c = std::move(*c);
    d.g = std::move(*g);
    if (bytes) {
      EXPECT_TRUE(cpu_->CopyToDevice(d.c.data(), data, bytes).ok());
      EXPECT_TRUE(gpu_->CopyToDevice(d.g.data(), data, bytes).ok());
    }
    return d;
  }
  Dual UpF(const std::vector<float>& v) { return Up(v.data(), v.size() * 4); }
  Dual Zeros(size_t n) { return UpF(std::vector<float>(n, 0.0f)); }

  std::vector<float> Down(const Dual& d, bool gpu, size_t n,
                          size_t offset = 0) {
    std::vector<float> v(n);
    EXPECT_TRUE(B(gpu)->CopyToHost(v.data(), d.F(gpu) + offset, n * 4).ok());
    return v;
  }
  std::vector<float> DownG(const Buffer& b, size_t n) {
    std::vector<float> v(n);
    EXPECT_TRUE(gpu_->CopyToHost(v.data(), b.data(), n * 4).ok());
    return v;
  }
  Buffer GpuZeros(size_t n) {
    auto b = gpu_->AllocateFloats(n);
    EXPECT_TRUE(b.ok());
    return std::move(*b);
  }

  std::vector<float> Random(size_t n, float lo = -1, float hi = 1) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }
  // Weight bits of `dtype` for n random values in [-1, 1).
  std::vector<uint8_t> RandomWeights(size_t n, DType dtype) {
    std::vector<float> f = Random(n);
    std::vector<uint8_t> out(n * DTypeSize(dtype));
    for (size_t i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &f[i], 4);
      if (dtype == DType::kF32) {
        std::memcpy(&out[i * 4], &bits, 4);
      } else {
        uint16_t h;
        if (dtype == DType::kBF16) {
          h = static_cast<uint16_t>(bits >> 16);
        } else {  // f16 with exponent in [-8, 0]
          h = static_cast<uint16_t>(((bits >> 31) << 15) |
                                    ((15 - (bits & 7)) << 10) |
                                    ((bits >> 3) & 0x3ff));
        }
        std::memcpy(&out[i * 2], &h, 2);
      }
    }
    return out;
  }

  void ExpectFusedEqualsUnfused(
      int in, int rows, int misaligned, int xs,
      const std::function<void(MatmulParams*, bool gpu)>& fuse,
      const std::function<absl::Status(const MatmulParams&, float*)>& unfused);

  // `rows` query rows at positions first.. over a random cache of
  // first + rows rows (dense heads, scale 1/sqrt(hd)): CPU and CUDA agree
  // within `tol`, and each row alone on the GPU has the batch's bits.
  void ExpectAttentionMatchesCpuAndRowsAlone(int rows, int nh, int nkv, int hd,
                                             int first, double tol,
                                             const std::string& what);

  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<Backend> cpu_;
  std::mt19937 rng_{20240611};
};

// max |gpu − cpu| <= tol · max(1, max |cpu|); no NaN on either side.
void ExpectClose(const std::vector<float>& cpu, const std::vector<float>& gpu,
                 double tol, const std::string& what) {
  ASSERT_EQ(cpu.size(), gpu.size()) << what;
  double scale = 1.0, worst = 0.0;
  size_t worst_i = 0;
  for (float c : cpu) scale = std::max(scale, std::fabs(double(c)));
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_FALSE(std::isnan(gpu[i])) << what << ": gpu NaN at " << i;
    ASSERT_FALSE(std::isnan(cpu[i])) << what << ": cpu NaN at " << i;
    const double d = std::fabs(double(gpu[i]) - double(cpu[i]));
    if (d > worst) worst = d, worst_i = i;
  }
  EXPECT_LE(worst, tol * scale) << what << " worst at " << worst_i << ": cpu "
                                << cpu[worst_i] << " gpu " << gpu[worst_i];
}

void ExpectBitEqual(const float* a, const float* b, size_t n,
                    const std::string& what) {
  EXPECT_EQ(0, std::memcmp(a, b, n * 4)) << what;
}

void CudaBackendTest::ExpectAttentionMatchesCpuAndRowsAlone(
    int rows, int nh, int nkv, int hd, int first, double tol,
    const std::string& what) {
  const int cap = first + rows;
  const std::vector<float> q = Random(rows * nh * hd, -2, 2),
                           k = Random(cap * nkv * hd, -2, 2),
                           v = Random(cap * nkv * hd);
  Dual qd = UpF(q), kd = UpF(k), vd = UpF(v), od = Zeros(rows * nh * hd);
  auto params = [&](bool g, int64_t r0, int64_t nrows, float* out) {
    AttentionParams p;
    p.rows = nrows;
    p.num_heads = nh;
    p.num_kv_heads = nkv;
    p.head_dim = hd;
    p.q = qd.F(g) + r0 * nh * hd;
    p.q_row_stride = nh * hd;
    p.q_head_stride = hd;
    p.k_cache = kd.F(g);
    p.v_cache = vd.F(g);
    p.kv_row_stride = nkv * hd;
    p.capacity = cap;
    p.first_position = first + r0;
    p.out = out;
    p.out_row_stride = nh * hd;
    p.scale = 1.0f / std::sqrt(float(hd));
    return p;
  };
  std::vector<float> res[2];
  for (bool g : {false, true}) {
    ASSERT_TRUE(B(g)->Attention(params(g, 0, rows, od.F(g))).ok()) << what;
    res[g] = Down(od, g, rows * nh * hd);
  }
  ExpectClose(res[0], res[1], tol, what);
  Buffer one = GpuZeros(nh * hd);
  for (int t = 0; t < rows; ++t) {
    ASSERT_TRUE(gpu_->Attention(params(true, t, 1, one.f32())).ok()) << what;
    ExpectBitEqual(DownG(one, nh * hd).data(), res[1].data() + t * nh * hd,
                   nh * hd, what + " row " + std::to_string(t));
  }
}

const int kRows[] = {1, 3, 7, 17};

// ---------------------------------------------------------------- Matmul

TEST_F(CudaBackendTest, Matmul) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int rows : {1, 2, 3, 4, 5, 7, 8, 9, 17, 40, 64}) {
      for (int in : {1, 3, 7, 8, 17, 40, 129, 256, 264, 1000}) {
        for (int out : {1, 3, 7, 17, 33, 100}) {
          const bool acc = (rows + in + out) % 2 == 0;
          const std::string what =
              absl::StrCat(DTypeName(dtype), " rows=", rows, " in=", in,
                           " out=", out, " acc=", acc);
          const std::vector<float> x = Random(rows * in);
          const std::vector<float> y0 = Random(rows * out);
          const std::vector<uint8_t> wh = RandomWeights(out * in, dtype);
          Dual xd = UpF(x), yd = UpF(y0), wd = Up(wh.data(), wh.size());
          std::vector<float> res[2];
          for (bool g : {false, true}) {
            auto w = B(g)->UploadWeight(dtype, wd.V(g), out, in);
            ASSERT_TRUE(w.ok()) << w.status();
            ASSERT_TRUE(
                B(g)->Matmul(DenseMatmul(rows, xd.F(g), *w, yd.F(g), acc)).ok())
                << what;
            res[g] = Down(yd, g, rows * out);
          }
          ExpectClose(res[0], res[1], 2e-5 * std::max(1, in / 8), what);
          // Row invariance: each row alone, bit for bit.
          if (rows > 1) {
            auto w = gpu_->UploadWeight(dtype, wd.g.data(), out, in);
            ASSERT_TRUE(w.ok());
            Buffer one = GpuZeros(out);
            for (int t = 0; t < rows; ++t) {
              if (acc) {
                ASSERT_TRUE(
                    gpu_->CopyToDevice(one.data(), y0.data() + t * out, out * 4)
                        .ok());
              }
              ASSERT_TRUE(gpu_->Matmul(DenseMatmul(1, xd.g.f32() + t * in, *w,
                                                   one.f32(), acc))
                              .ok());
              ExpectBitEqual(DownG(one, out).data(), res[1].data() + t * out,
                             out, what + " row " + std::to_string(t));
            }
          }
        }
      }
    }
  }
}

// A matmul with an input op fused into it (`fuse` sets the op on its
// params) gives the bits of that op run alone (`unfused`, into a staging
// buffer of rows × in) then the plain matmul on the GPU, and is close to the
// CPU's. x rows are `xs` apart, starting `misaligned` floats into x.
void CudaBackendTest::ExpectFusedEqualsUnfused(
    int in, int rows, int misaligned, int xs,
    const std::function<void(MatmulParams*, bool gpu)>& fuse,
    const std::function<absl::Status(const MatmulParams&, float*)>& unfused) {
  const int out = 300;
  const std::vector<float> x = Random((rows + 1) * xs), y0 = Random(rows * out);
  const std::vector<uint8_t> wh = RandomWeights(out * in, DType::kBF16);
  Dual xd = UpF(x), wd = Up(wh.data(), wh.size());
  const std::string what =
      absl::StrCat("in=", in, " rows=", rows, " mis=", misaligned);
  std::vector<float> fused[2];
  for (bool g : {false, true}) {
    auto w = B(g)->UploadWeight(DType::kBF16, wd.V(g), out, in);
    ASSERT_TRUE(w.ok());
    Dual yd = UpF(y0);
    MatmulParams p = DenseMatmul(rows, xd.F(g) + misaligned, *w, yd.F(g), true);
    p.x_stride = xs;
    fuse(&p, g);
    ASSERT_TRUE(B(g)->Matmul(p).ok()) << what;
    fused[g] = Down(yd, g, rows * out);
    if (!g) continue;
    Buffer staged = GpuZeros(rows * in);
    Dual sd = UpF(y0);
    ASSERT_TRUE(unfused(p, staged.f32()).ok()) << what;
    ASSERT_TRUE(
        gpu_->Matmul(DenseMatmul(rows, staged.f32(), *w, sd.g.f32(), true))
            .ok());
    ExpectBitEqual(fused[1].data(), DownG(sd.g, rows * out).data(), rows * out,
                   what);
  }
  ExpectClose(fused[0], fused[1], 1e-4, what + " cpu vs cuda");
}

// A fused-norm matmul gives the bits of RmsNorm then the plain matmul on the
// GPU: fused in the tensor-core kernel up to kMaxFusedNormRows rows (warp and
// block norm orders: in < and >= 1024), normalised first beyond, with a
// misaligned x (other staging path) and accumulation; and it is close to
// the CPU's.
TEST_F(CudaBackendTest, MatmulFusedNormEqualsRmsNormThenMatmul) {
  for (int in : {256, 5120}) {
    for (int rows : {1, 2, 4, 8, 9, 33}) {
      for (int misaligned : {0, 1}) {
        Dual nd = UpF(Random(in));
        ExpectFusedEqualsUnfused(
            in, rows, misaligned, in + 4,
            [&](MatmulParams* p, bool g) { p->norm_weight = nd.F(g); },
            [&](const MatmulParams& p, float* normed) {
              return gpu_->RmsNorm(FusedNormOf(p, normed));
            });
      }
    }
  }
}

// GPU: SwiGLU fused in the tensor-core kernel (every T, aligned and
// misaligned x) gives the bits of Swiglu then the matmul, close to the CPU.
TEST_F(CudaBackendTest, MatmulFusedSwigluEqualsSwigluThenMatmul) {
  for (int in : {256, 17408}) {
    for (int rows : {1, 8, 9, 64}) {
      for (int misaligned : {0, 1}) {
        ExpectFusedEqualsUnfused(
            in, rows, misaligned, 2 * in + 4,
            [](MatmulParams* p, bool) { p->swiglu = true; },
            [&](const MatmulParams& p, float* act) {
              return gpu_->Swiglu(FusedSwigluOf(p, act));
            });
      }
    }
  }
}

// The 16-byte and the scalar load paths give the same bits: the same rows at
// an aligned and at a misaligned address, with strides.
TEST_F(CudaBackendTest, MatmulLoadPathsAgreeAndStridesWork) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int rows : {1, 2, 4, 8, 19}) {
      const int in = 5120 / 4 + 8, out = 37, ys = 45;
      const std::vector<float> x = Random((rows + 1) * (in + 4));
      // The same values one element further on: x + 1 in this buffer is
      // misaligned for 16-byte loads but holds exactly x's rows.
      std::vector<float> shifted(x.size() + 1, 0.0f);
      std::copy(x.begin(), x.end(), shifted.begin() + 1);
      const std::vector<uint8_t> wh = RandomWeights(out * in, dtype);
      Dual xa = UpF(x), xm = UpF(shifted), wd = Up(wh.data(), wh.size());
      auto w = gpu_->UploadWeight(dtype, wd.g.data(), out, in);
      ASSERT_TRUE(w.ok());
      std::vector<float> res[2];
      for (int misaligned : {0, 1}) {
        const Dual& xd = misaligned ? xm : xa;
        MatmulParams p;
        p.rows = rows;
        p.in = in;
        p.out = out;
        p.x = xd.g.f32() + misaligned;
        p.x_stride = in + 4;
        p.w_dtype = dtype;
        p.w_layout = w->layout;
        p.w = w->data;
        Buffer y = GpuZeros(rows * ys);
        p.y = y.f32();
        p.y_stride = ys;
        ASSERT_TRUE(gpu_->Matmul(p).ok());
        const std::vector<float> all = DownG(y, rows * ys);
        for (int t = 0; t < rows; ++t) {
          res[misaligned].insert(res[misaligned].end(), all.begin() + t * ys,
                                 all.begin() + t * ys + out);
        }
        // CPU agrees on the strided layout too.
        MatmulParams pc = p;
        pc.x = xd.c.f32() + misaligned;
        pc.w_layout = WeightLayout::kRowMajor;
        pc.w = wd.c.data();
        auto yc = cpu_->AllocateFloats(rows * ys);
        ASSERT_TRUE(yc.ok());
        pc.y = yc->f32();
        ASSERT_TRUE(cpu_->Matmul(pc).ok());
        std::vector<float> c(rows * ys);
        std::memcpy(c.data(), yc->data(), c.size() * 4);
        ExpectClose(c, all, 2e-5 * in / 8,
                    absl::StrCat("strided ", DTypeName(dtype)));
      }
      ExpectBitEqual(
          res[0].data(), res[1].data(), res[0].size(),
          absl::StrCat(DTypeName(dtype), " rows=", rows, " vec vs scalar"));
    }
  }
}

// ---------------------------------------------------------------- Norms

TEST_F(CudaBackendTest, RmsNormAndGatedRmsNorm) {
  for (int rows : kRows) {
    for (int dim : {1, 3, 7, 17, 128, 1000, 5120}) {
      const int xs = dim + 3;
      const std::vector<float> x = Random(rows * xs, -3, 3),
                               z = Random(rows * xs, -4, 4), w = Random(dim);
      Dual xd = UpF(x), zd = UpF(z), wd = UpF(w), yd = Zeros(rows * xs);
      for (bool gated : {false, true}) {
        for (bool plus_one : {true, false}) {
          if (gated && !plus_one) continue;
          const std::string what =
              absl::StrCat(gated ? "gated" : "rms", " rows=", rows,
                           " dim=", dim, " plus_one=", plus_one);
          auto run = [&](bool g, int64_t r0, int64_t nrows, float* y) {
            if (gated) {
              GatedRmsNormParams p;
              p.rows = nrows;
              p.dim = dim;
              p.x = xd.F(g) + r0 * xs;
              p.x_stride = xs;
              p.z = zd.F(g) + r0 * xs;
              p.z_stride = xs;
              p.y = y;
              p.y_stride = xs;
              p.weight = wd.F(g);
              p.eps = 1e-6f;
              return B(g)->GatedRmsNorm(p);
            }
            RmsNormParams p;
            p.rows = nrows;
            p.dim = dim;
            p.x = xd.F(g) + r0 * xs;
            p.x_stride = xs;
            p.y = y;
            p.y_stride = xs;
            p.weight = wd.F(g);
            p.plus_one = plus_one;
            p.eps = 1e-6f;
            return B(g)->RmsNorm(p);
          };
          std::vector<float> res[2];
          for (bool g : {false, true}) {
            ASSERT_TRUE(run(g, 0, rows, yd.F(g)).ok()) << what;
            res[g] = Down(yd, g, rows * xs);
          }
          ExpectClose(res[0], res[1], 1e-5, what);
          Buffer one = GpuZeros(xs);
          for (int t = 0; t < rows; ++t) {
            ASSERT_TRUE(run(true, t, 1, one.f32()).ok());
            ExpectBitEqual(DownG(one, dim).data(), res[1].data() + t * xs, dim,
                           what + " row " + std::to_string(t));
          }
        }
      }
      // In place equals out of place.
      RmsNormParams p;
      p.rows = rows;
      p.dim = dim;
      p.x = xd.g.f32();
      p.x_stride = xs;
      p.y = yd.g.f32();
      p.y_stride = xs;
      p.weight = wd.g.f32();
      ASSERT_TRUE(gpu_->RmsNorm(p).ok());
      p.y = xd.g.f32();
      ASSERT_TRUE(gpu_->RmsNorm(p).ok());
      const std::vector<float> in_place = Down(xd, true, rows * xs),
                               out_of_place = Down(yd, true, rows * xs);
      for (int t = 0; t < rows; ++t) {
        ExpectBitEqual(in_place.data() + t * xs, out_of_place.data() + t * xs,
                       dim, absl::StrCat("in place dim=", dim, " row ", t));
      }
    }
  }
}

// ---------------------------------------------------------------- Rope

TEST_F(CudaBackendTest, Rope) {
  for (int rows : kRows) {
    for (int heads : {1, 3}) {
      for (int hd : {2, 8, 18, 256}) {
        for (int rot : {2, hd / 2 - (hd / 2) % 2, hd}) {
          if (rot <= 0) continue;
          for (int first : {5, 1000, 70000}) {
            const std::string what =
                absl::StrCat("rope rows=", rows, " heads=", heads, " hd=", hd,
                             " rot=", rot, " first=", first);
            const int hs = hd + 2, rs = heads * hs + 1;
            const std::vector<float> x = Random(rows * rs);
            const std::vector<float> inv = RopeInvFreq(10000000.0, rot);
            Dual xd = UpF(x), fd = UpF(inv);
            auto params = [&](bool g, float* base, int64_t r0, int64_t nrows) {
              RopeParams p;
              p.rows = nrows;
              p.heads = heads;
              p.head_dim = hd;
              p.rotary_dim = rot;
              p.x = base;
              p.row_stride = rs;
              p.head_stride = hs;
              p.first_position = first + r0;
              p.inv_freq = fd.F(g);
              return p;
            };
            std::vector<float> res[2];
            for (bool g : {false, true}) {
              ASSERT_TRUE(B(g)->Rope(params(g, xd.F(g), 0, rows)).ok()) << what;
              res[g] = Down(xd, g, rows * rs);
            }
            ExpectClose(res[0], res[1], 1e-5, what);
            Dual fresh = UpF(x);
            for (int t = 0; t < rows; ++t) {
              ASSERT_TRUE(
                  gpu_->Rope(params(true, fresh.g.f32() + t * rs, t, 1)).ok());
            }
            ExpectBitEqual(Down(fresh, true, rows * rs).data(), res[1].data(),
                           rows * rs, what + " rows alone");
          }
        }
      }
    }
  }
}

// AttentionInputs fused into one kernel against the six ops it stands for
// (Backend::AttentionInputs, on the GPU): the same bits in q, k and both
// caches, for one session's rows (consecutive cache rows) and for a session
// batch (a cache and a position per row), partial and full rotary dims.
TEST_F(CudaBackendTest, AttentionInputsFusedEqualsTheSixOps) {
  for (int rows : kRows) {
    for (auto [nh, nkv, hd] :
         {std::tuple{24, 4, 256}, std::tuple{6, 2, 64}, std::tuple{3, 3, 18}}) {
      for (int rot : {0, hd / 4 - (hd / 4) % 2, hd}) {
        for (bool batch : {false, true}) {
          const std::string what =
              absl::StrCat("rows=", rows, " nh=", nh, " nkv=", nkv, " hd=", hd,
                           " rot=", rot, " batch=", batch);
          const int kv_dim = nkv * hd, W = nh * 2 * hd + 2 * kv_dim,
                    cap = 40 + rows;
          const std::vector<float> qkv =
              Random(static_cast<size_t>(rows) * W, -3, 3);
          const std::vector<float> qw = Random(hd, -0.5f, 0.5f),
                                   kw = Random(hd, -0.5f, 0.5f);
          const std::vector<float> inv =
              RopeInvFreq(10000000.0, std::max(rot, 2));
          Dual qwd = UpF(qw), kwd = UpF(kw), fd = UpF(inv);
          std::vector<int32_t> pos(rows);
          for (int t = 0; t < rows; ++t)
            pos[t] = batch ? (7 * t + 3) % cap : 5 + t;
          Dual posd = Up(pos.data(), rows * 4);
          std::vector<float> out[2][3];  // [fused][qkv, k caches, v caches]
          for (bool fused : {false, true}) {
            Dual x = UpF(qkv);
            // Batch: one cache pair per row; otherwise one pair for all rows.
            const int caches = batch ? rows : 1;
            Dual kc = Zeros(static_cast<size_t>(caches) * cap * kv_dim);
            Dual vc = Zeros(static_cast<size_t>(caches) * cap * kv_dim);
            std::vector<float*> kp(caches), vp(caches);
            for (int i = 0; i < caches; ++i) {
              kp[i] = kc.F(true) + static_cast<size_t>(i) * cap * kv_dim;
              vp[i] = vc.F(true) + static_cast<size_t>(i) * cap * kv_dim;
            }
            Dual kpd = Up(kp.data(), caches * sizeof(float*));
            Dual vpd = Up(vp.data(), caches * sizeof(float*));
            FusedQkvRows r;
            r.rows = rows;
            r.heads = nh;
            r.kv_heads = nkv;
            r.head_dim = hd;
            r.rotary_dim = rot;
            r.x = x.F(true);
            r.q_norm = qwd.F(true);
            r.k_norm = kwd.F(true);
            r.inv_freq = fd.F(true);
            AttentionInputsParams p = AttentionInputsOf(r);
            if (batch) {
              p.q_rope.positions = p.k_rope.positions =
                  static_cast<int32_t*>(posd.V(true));
              p.k_scatter.dst_rows = p.v_scatter.dst_rows = p.q_rope.positions;
              p.k_scatter.dst = static_cast<void* const*>(kpd.V(true));
              p.v_scatter.dst = static_cast<void* const*>(vpd.V(true));
            } else {
              p.q_rope.first_position = p.k_rope.first_position = pos[0];
              p.k_scatter.dst_base = kc.F(true);
              p.v_scatter.dst_base = vc.F(true);
              p.k_scatter.dst_first_row = p.v_scatter.dst_first_row = pos[0];
            }
            ASSERT_TRUE(FusesAttentionInputs(p)) << what;
            const absl::Status s = fused ? gpu_->AttentionInputs(p)
                                         : gpu_->Backend::AttentionInputs(p);
            ASSERT_TRUE(s.ok()) << what << ": " << s;
            out[fused][0] = Down(x, true, qkv.size());
            out[fused][1] =
                Down(kc, true, static_cast<size_t>(caches) * cap * kv_dim);
            out[fused][2] =
                Down(vc, true, static_cast<size_t>(caches) * cap * kv_dim);
          }
          for (int b = 0; b < 3; ++b) {
            ASSERT_EQ(out[0][b].size(), out[1][b].size());
            ExpectBitEqual(out[0][b].data(), out[1][b].data(), out[0][b].size(),
                           what + (b == 0   ? " q|k|v"
                                   : b == 1 ? " k cache"
                                            : " v cache"));
          }
          // The rows were really normalised and written (not left as they
          // were).
          EXPECT_NE(0,
                    std::memcmp(out[1][0].data(), qkv.data(), qkv.size() * 4))
              << what;
        }
      }
    }
  }
}

// ---------------------------------------------------------------- Attention

TEST_F(CudaBackendTest, Attention) {
  struct Heads {
    int nh, nkv;
  };
  for (int rows : kRows) {
    for (Heads hh : {Heads{1, 1}, Heads{4, 2}, Heads{3, 1}, Heads{8, 2}}) {
      for (int hd : {1, 7, 17, 64, 100, 256}) {
        for (int first : {0, 5, 250, 700}) {
          for (bool gated : {false, true}) {
            const std::string what = absl::StrCat(
                "attention rows=", rows, " nh=", hh.nh, " nkv=", hh.nkv,
                " hd=", hd, " first=", first, " gated=", gated);
            const int cap = first + rows + 3;
            const int qs = hh.nh * hd + 5, kvs = hh.nkv * hd + 1,
                      os = hh.nh * hd + 2;
            const std::vector<float> q = Random(rows * qs, -2, 2),
                                     gt = Random(rows * qs, -3, 3),
                                     k = Random(cap * kvs, -2, 2),
                                     v = Random(cap * kvs);
            Dual qd = UpF(q), gd = UpF(gt), kd = UpF(k), vd = UpF(v),
                 od = Zeros(rows * os);
            auto params = [&](bool g, int64_t r0, int64_t nrows, float* out) {
              AttentionParams p;
              p.rows = nrows;
              p.num_heads = hh.nh;
              p.num_kv_heads = hh.nkv;
              p.head_dim = hd;
              p.q = qd.F(g) + r0 * qs;
              p.q_row_stride = qs;
              p.q_head_stride = hd;
              if (gated) {
                p.gate = gd.F(g) + r0 * qs;
                p.gate_row_stride = qs;
                p.gate_head_stride = hd;
              }
              p.k_cache = kd.F(g);
              p.v_cache = vd.F(g);
              p.kv_row_stride = kvs;
              p.capacity = cap;
              p.first_position = first + r0;
              p.out = out;
              p.out_row_stride = os;
              p.scale = 1.0f / std::sqrt(float(hd));
              return p;
            };
            std::vector<float> res[2];
            for (bool g : {false, true}) {
              ASSERT_TRUE(B(g)->Attention(params(g, 0, rows, od.F(g))).ok())
                  << what;
              res[g] = Down(od, g, rows * os);
            }
            // fp32 sums over up to ~700 keys in different orders.
            ExpectClose(res[0], res[1], 2e-5, what);
            Buffer one = GpuZeros(os);
            for (int t = 0; t < rows; ++t) {
              ASSERT_TRUE(gpu_->Attention(params(true, t, 1, one.f32())).ok());
              ExpectBitEqual(DownG(one, hh.nh * hd).data(),
                             res[1].data() + t * os, hh.nh * hd,
                             what + " row " + std::to_string(t));
            }
          }
        }
      }
    }
  }
}

// Past 64·256 visible rows the chunk count saturates and chunks grow.
TEST_F(CudaBackendTest, AttentionLongContext) {
  // 17000-term fp32 sums: the CPU's sequential order drifts by ~√n ulps.
  ExpectAttentionMatchesCpuAndRowsAlone(3, 2, 1, 64, 17000, 1e-4,
                                        "long attention");
}

// A launch with many rows gives a block several query heads of one KV head
// (HeadsPerBlock: 6 here); a row alone gets one or three. Same bits, and the
// CPU agrees.
TEST_F(CudaBackendTest, AttentionHeadsPerBlockDoNotChangeBits) {
  ExpectAttentionMatchesCpuAndRowsAlone(100, 24, 4, 256, 40, 1e-4,
                                        "hd=256 first=40");
  ExpectAttentionMatchesCpuAndRowsAlone(100, 24, 4, 64, 3000, 1e-4,
                                        "hd=64 first=3000");
  ExpectAttentionMatchesCpuAndRowsAlone(100, 24, 4, 100, 300, 1e-4,
                                        "hd=100 first=300");
}

TEST_F(CudaBackendTest, SessionBatchMatchesSessionsAlone) {
  ExpectSessionBatchMatchesAlone(gpu_.get(), 77);
  ExpectSessionBatchMatchesAlone(gpu_.get(), 78);
}

TEST_F(CudaBackendTest, AttentionRejectsRowsPastCapacity) {
  Buffer b = GpuZeros(64);
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
  EXPECT_EQ(gpu_->Attention(p).code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------- Conv1d

TEST_F(CudaBackendTest, Conv1dSnapshotsAndDecode) {
  for (int rows : kRows) {
    for (int channels : {1, 3, 7, 17, 300}) {
      for (int kernel : {2, 3, 4, 5}) {
        const std::string what =
            absl::StrCat("conv1d rows=", rows, " C=", channels, " K=", kernel);
        const int s = kernel - 1, ssz = channels * s, xs = channels + 1;
        const std::vector<float> x = Random(rows * xs, -2, 2),
                                 w = Random(channels * kernel),
                                 st = Random(ssz);
        Dual xd = UpF(x), wd = UpF(w), sd = UpF(st), yd = Zeros(rows * xs),
             snaps = Zeros(rows * ssz);
        auto params = [&](bool g) {
          Conv1dParams p;
          p.rows = rows;
          p.channels = channels;
          p.kernel = kernel;
          p.x = xd.F(g);
          p.x_stride = xs;
          p.y = yd.F(g);
          p.y_stride = xs;
          p.weight = wd.F(g);
          p.state_in = sd.F(g);
          p.state_out = snaps.F(g);
          p.state_out_stride = ssz;
          return p;
        };
        std::vector<float> y[2], states[2];
        for (bool g : {false, true}) {
          ASSERT_TRUE(B(g)->Conv1d(params(g)).ok()) << what;
          y[g] = Down(yd, g, rows * xs);
          states[g] = Down(snaps, g, rows * ssz);
        }
        ExpectClose(y[0], y[1], 1e-5, what + " y");
        ExpectClose(states[0], states[1], 0, what + " states");
        // Decode token by token, in place: bit-identical outputs and states.
        Buffer y1 = GpuZeros(xs);
        for (int t = 0; t < rows; ++t) {
          Conv1dParams p = params(true);
          p.rows = 1;
          p.x = xd.g.f32() + t * xs;
          p.y = y1.f32();
          p.state_out = sd.g.f32();
          p.state_out_stride = 0;
          ASSERT_TRUE(gpu_->Conv1d(p).ok());
          ExpectBitEqual(DownG(y1, channels).data(), y[1].data() + t * xs,
                         channels, what + " decode y " + std::to_string(t));
          ExpectBitEqual(Down(sd, true, ssz).data(), states[1].data() + t * ssz,
                         ssz, what + " decode state " + std::to_string(t));
        }
      }
    }
  }
}

// Several sessions' chunks in one call (LaunchConv1dSlices: a PrefillBatch
// pass) == each chunk's own call, outputs and states bit for bit; more
// chunks than one launch's table holds; one chunk of a single row.
TEST_F(CudaBackendTest, Conv1dSlicesEqualEachAlone) {
  const int channels = 300, kernel = 4, s = kernel - 1, xs = channels + 5;
  const std::vector<float> w = Random(channels * kernel);
  Dual wd = UpF(w);
  std::vector<int> rows;
  for (int i = 0; i < 37; ++i) rows.push_back(i == 3 ? 1 : 1 + (i * 29) % 150);
  struct Chunk {
    Dual x, y, state;
  };
  auto make = [&]() {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> d(-2, 2);
    std::vector<Chunk> chunks;
    for (int r : rows) {
      std::vector<float> x(r * xs), st(channels * s);
      for (float& v : x) v = d(rng);
      for (float& v : st) v = d(rng);
      chunks.push_back({UpF(x), Zeros(r * xs), UpF(st)});
    }
    return chunks;
  };
  auto params = [&](const std::vector<Chunk>& chunks) {
    std::vector<Conv1dParams> ps;
    for (size_t i = 0; i < chunks.size(); ++i) {
      Conv1dParams p;
      p.rows = rows[i];
      p.channels = channels;
      p.kernel = kernel;
      p.x = chunks[i].x.F(true);
      p.x_stride = xs;
      p.y = chunks[i].y.F(true);
      p.y_stride = xs;
      p.weight = wd.F(true);
      p.state_in = p.state_out = chunks[i].state.F(true);
      ps.push_back(p);
    }
    return ps;
  };
  const std::vector<Chunk> alone = make(), together = make();
  for (const Conv1dParams& p : params(alone)) ASSERT_TRUE(gpu_->Conv1d(p).ok());
  ASSERT_TRUE(LaunchConv1dSlices(params(together), nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string what =
        absl::StrCat("conv1d slice ", i, " of ", rows[i], " rows");
    ExpectBitEqual(Down(together[i].y, true, rows[i] * xs).data(),
                   Down(alone[i].y, true, rows[i] * xs).data(), rows[i] * xs,
                   what + " y");
    ExpectBitEqual(Down(together[i].state, true, channels * s).data(),
                   Down(alone[i].state, true, channels * s).data(),
                   channels * s, what + " state");
  }
  // The chunks of one call share their weights.
  std::vector<Conv1dParams> mixed = params(together);
  mixed[1].weight = mixed[0].y;
  EXPECT_EQ(LaunchConv1dSlices(mixed, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------- GDN

TEST_F(CudaBackendTest, GatedDeltaRuleSnapshotsAndDecode) {
  struct Shape {
    int nk, nv, dk, dv;
  };
  for (int rows : kRows) {
    for (Shape sh : {Shape{1, 1, 1, 1}, Shape{1, 3, 7, 3}, Shape{2, 4, 17, 7},
                     Shape{3, 3, 3, 17}, Shape{2, 4, 128, 128},
                     Shape{1, 2, 256, 40}, Shape{2, 2, 64, 33}}) {
      const std::string what =
          absl::StrCat("gdn rows=", rows, " nk=", sh.nk, " nv=", sh.nv,
                       " dk=", sh.dk, " dv=", sh.dv);
      const int width = 2 * sh.nk * sh.dk + sh.nv * sh.dv + 3;
      const int ssz = sh.nv * sh.dk * sh.dv, os = sh.nv * sh.dv + 1,
                abs_ = sh.nv + 2;
      const std::vector<float> qkv = Random(rows * width),
                               a = Random(rows * abs_, -3, 3),
                               b = Random(rows * abs_, -3, 3),
                               a_log = Random(sh.nv, -1, 1), dt = Random(sh.nv),
                               st = Random(ssz, -0.5, 0.5);
      Dual qd = UpF(qkv), ad = UpF(a), bd = UpF(b), ld = UpF(a_log),
           dd = UpF(dt), sd = UpF(st), od = Zeros(rows * os),
           snaps = Zeros(size_t(rows) * ssz);
      auto params = [&](bool g) {
        GatedDeltaRuleParams p;
        p.rows = rows;
        p.num_k_heads = sh.nk;
        p.num_v_heads = sh.nv;
        p.k_head_dim = sh.dk;
        p.v_head_dim = sh.dv;
        p.q = qd.F(g);
        p.k = qd.F(g) + sh.nk * sh.dk;
        p.v = qd.F(g) + 2 * sh.nk * sh.dk;
        p.qkv_stride = width;
        p.a = ad.F(g);
        p.b = bd.F(g);
        p.ab_stride = abs_;
        p.a_log = ld.F(g);
        p.dt_bias = dd.F(g);
        p.state_in = sd.F(g);
        p.state_out = snaps.F(g);
        p.state_out_stride = ssz;
        p.out = od.F(g);
        p.out_stride = os;
        return p;
      };
      std::vector<float> out[2], states[2];
      for (bool g : {false, true}) {
        ASSERT_TRUE(B(g)->GatedDeltaRule(params(g)).ok()) << what;
        out[g] = Down(od, g, rows * os);
        states[g] = Down(snaps, g, size_t(rows) * ssz);
      }
      ExpectClose(out[0], out[1], 1e-4, what + " out");
      ExpectClose(states[0], states[1], 1e-4, what + " states");
      // Decode token by token, in place: bit-identical to the verify call.
      Buffer o1 = GpuZeros(os);
      for (int t = 0; t < rows; ++t) {
        GatedDeltaRuleParams p = params(true);
        p.rows = 1;
        p.q += t * width;
        p.k += t * width;
        p.v += t * width;
        p.a += t * abs_;
        p.b += t * abs_;
        p.state_out = sd.g.f32();
        p.state_out_stride = 0;
        p.out = o1.f32();
        ASSERT_TRUE(gpu_->GatedDeltaRule(p).ok());
        ExpectBitEqual(DownG(o1, sh.nv * sh.dv).data(), out[1].data() + t * os,
                       sh.nv * sh.dv,
                       what + " decode out " + std::to_string(t));
        ExpectBitEqual(Down(sd, true, ssz).data(),
                       states[1].data() + size_t(t) * ssz, ssz,
                       what + " decode state " + std::to_string(t));
      }
    }
  }
}

// A bf16 recurrent state (state_dtype): the GPU's T-token call (snapshots)
// equals T one-token calls in place bit for bit, outputs and state bytes;
// the GPU and the CPU (the same rounding) agree within tolerance, the
// states up to a rounding step of bf16.
TEST_F(CudaBackendTest, GatedDeltaRuleBf16StateSnapshotsAndDecode) {
  struct Shape {
    int nk, nv, dk, dv;
  };
  for (int rows : {1, 5, 16}) {
    for (Shape sh : {Shape{1, 3, 7, 3}, Shape{2, 4, 128, 128},
                     Shape{1, 2, 256, 40}, Shape{2, 2, 64, 33}}) {
      const std::string what =
          absl::StrCat("gdn bf16 state rows=", rows, " nk=", sh.nk,
                       " nv=", sh.nv, " dk=", sh.dk, " dv=", sh.dv);
      const int width = 2 * sh.nk * sh.dk + sh.nv * sh.dv + 3;
      const int ssz = sh.nv * sh.dk * sh.dv, os = sh.nv * sh.dv + 1,
                abs_ = sh.nv + 2;
      const std::vector<float> qkv = Random(rows * width),
                               a = Random(rows * abs_, -3, 3),
                               b = Random(rows * abs_, -3, 3),
                               a_log = Random(sh.nv, -1, 1), dt = Random(sh.nv),
                               st = Random(ssz, -0.5, 0.5);
      std::vector<uint16_t> st16(ssz);
      for (int i = 0; i < ssz; ++i) st16[i] = cpu::FloatToBf16(st[i]);
      Dual qd = UpF(qkv), ad = UpF(a), bd = UpF(b), ld = UpF(a_log),
           dd = UpF(dt), sd = Up(st16.data(), ssz * 2), od = Zeros(rows * os),
           snaps = Up(std::vector<uint16_t>(size_t(rows) * ssz).data(),
                      size_t(rows) * ssz * 2);
      auto params = [&](bool g) {
        GatedDeltaRuleParams p;
        p.rows = rows;
        p.num_k_heads = sh.nk;
        p.num_v_heads = sh.nv;
        p.k_head_dim = sh.dk;
        p.v_head_dim = sh.dv;
        p.q = qd.F(g);
        p.k = qd.F(g) + sh.nk * sh.dk;
        p.v = qd.F(g) + 2 * sh.nk * sh.dk;
        p.qkv_stride = width;
        p.a = ad.F(g);
        p.b = bd.F(g);
        p.ab_stride = abs_;
        p.a_log = ld.F(g);
        p.dt_bias = dd.F(g);
        p.state_in = sd.V(g);
        p.state_out = snaps.V(g);
        p.state_out_stride = ssz;
        p.state_dtype = DType::kBF16;
        p.out = od.F(g);
        p.out_stride = os;
        return p;
      };
      auto state_bytes = [&](const Dual& d, bool g, size_t n, size_t at) {
        std::vector<uint16_t> h(n);
        EXPECT_TRUE(B(g)->CopyToHost(h.data(),
                                     static_cast<const uint16_t*>(d.V(g)) + at,
                                     n * 2)
                        .ok());
        return h;
      };
      auto widen = [](const std::vector<uint16_t>& h) {
        std::vector<float> v(h.size());
        for (size_t i = 0; i < h.size(); ++i) v[i] = cpu::Bf16ToFloat(h[i]);
        return v;
      };
      std::vector<float> out[2];
      std::vector<uint16_t> states[2];
      for (bool g : {false, true}) {
        ASSERT_TRUE(B(g)->GatedDeltaRule(params(g)).ok()) << what;
        out[g] = Down(od, g, rows * os);
        states[g] = state_bytes(snaps, g, size_t(rows) * ssz, 0);
      }
      ExpectClose(out[0], out[1], 1e-3, what + " out");
      ExpectClose(widen(states[0]), widen(states[1]), 1e-2, what + " states");
      Buffer o1 = GpuZeros(os);
      for (int t = 0; t < rows; ++t) {
        GatedDeltaRuleParams p = params(true);
        p.rows = 1;
        p.q += t * width;
        p.k += t * width;
        p.v += t * width;
        p.a += t * abs_;
        p.b += t * abs_;
        p.state_out = sd.V(true);
        p.state_out_stride = 0;
        p.out = o1.f32();
        ASSERT_TRUE(gpu_->GatedDeltaRule(p).ok());
        ExpectBitEqual(DownG(o1, sh.nv * sh.dv).data(), out[1].data() + t * os,
                       sh.nv * sh.dv,
                       what + " decode out " + std::to_string(t));
        EXPECT_EQ(
            state_bytes(sd, true, ssz, 0),
            std::vector<uint16_t>(states[1].begin() + size_t(t) * ssz,
                                  states[1].begin() + size_t(t + 1) * ssz))
            << what << " decode state " << t;
      }
    }
  }
}

// The fused rule + gated norm (GatedDeltaRuleNormed), with and without the
// conv before it, against the ops in turn on the GPU, bit for bit (outputs,
// states, snapshots, conv outputs and conv states): the hot shape at one
// token (the fused kernel, clusters of two tiles, or of a key head's 2 ×
// group blocks with the conv; also a session batch of one row, the recorded
// decode step's form) and every other case (the backend's fallback), with
// snapshots (verify), in place (decode) and on per-session states (a
// session batch), on fp32 and on bf16 recurrent states (state_dtype; the
// conv states stay fp32); and against the CPU with the same state type
// within tolerance (a bf16 state may differ there by its rounding step).
TEST_F(CudaBackendTest, GatedDeltaRuleNormedEqualsRuleThenNorm) {
  struct Shape {
    int nk, nv, dk, dv;
  };
  enum Mode { kSnapshots, kInPlace, kSessionBatch };
  for (DType sdt : {DType::kF32, DType::kBF16}) {
    const bool bf16 = sdt == DType::kBF16;
    const size_t selem = DTypeSize(sdt);  // bytes of a rule state element
    for (int rows : kRows) {
      for (Shape sh : {Shape{2, 6, 128, 128}, Shape{1, 2, 128, 128},
                       Shape{2, 8, 128, 128}, Shape{2, 4, 64, 33}}) {
        for (Mode mode : {kSnapshots, kInPlace, kSessionBatch}) {
          for (bool conv : {false, true}) {
            const std::string what = absl::StrCat(
                "gdn+norm rows=", rows, " nk=", sh.nk, " nv=", sh.nv,
                " dk=", sh.dk, " dv=", sh.dv, " mode=", mode, " conv=", conv,
                " state=", DTypeName(sdt));
            const int vd = sh.nv * sh.dv, width = 2 * sh.nk * sh.dk + vd + 5;
            const int C = 2 * sh.nk * sh.dk + vd,
                      xw = C + 7;  // conv channels; raw row width
            const int P =
                vd + sh.nv + 3;  // z row: nv heads of dv, then other columns
            const int ssz = sh.nv * sh.dk * sh.dv, csz = C * 3,
                      abs_ = sh.nv + 2;
            const int slots =
                mode == kInPlace ? 1 : rows;  // states or snapshots
            const std::vector<float> qkv = Random(rows * width),
                                     a = Random(rows * abs_, -3, 3),
                                     b = Random(rows * abs_, -3, 3),
                                     a_log = Random(sh.nv, -1, 1),
                                     dt = Random(sh.nv),
                                     z = Random(rows * P, -4, 4),
                                     w = Random(sh.dv),
                                     st =
                                         Random(size_t(slots) * ssz, -0.5, 0.5),
                                     raw = Random(rows * xw, -2, 2),
                                     cw = Random(C * 4, -1, 1),
                                     cst = Random(size_t(slots) * csz, -2, 2);
            Dual qd = UpF(qkv), ad = UpF(a), bd = UpF(b), ld = UpF(a_log),
                 dd = UpF(dt), zd = UpF(z), wd = UpF(w), rawd = UpF(raw),
                 cwd = UpF(cw);
            // Per run: fresh states, snapshots, per-session tables, conv
            // outputs and output.
            struct Run {
              Dual state, snaps, table, out, cstate, csnaps, ctable, y;
            };
            // The rule's or the conv's states by the mode (their params name
            // the state fields alike).
            auto set_states = [&](bool g, auto& x, const Dual& state,
                                  const Dual& snaps, const Dual& tab,
                                  size_t size) {
              using Table = std::remove_reference_t<decltype(x.states)>;
              if (mode == kSessionBatch) {
                x.states = static_cast<Table>(tab.V(g));
              } else {
                x.state_in = state.F(g);
                x.state_out = mode == kInPlace ? state.F(g) : snaps.F(g);
                x.state_out_stride = mode == kInPlace ? 0 : size;
              }
            };
            auto params = [&](bool g, const Run& run) {
              GatedDeltaRuleNormParams p;
              GatedDeltaRuleParams& r = p.rule;
              const float* qkv_base = conv ? run.y.F(g) : qd.F(g);
              r.rows = rows;
              r.num_k_heads = sh.nk;
              r.num_v_heads = sh.nv;
              r.k_head_dim = sh.dk;
              r.v_head_dim = sh.dv;
              r.q = qkv_base;
              r.k = qkv_base + sh.nk * sh.dk;
              r.v = qkv_base + 2 * sh.nk * sh.dk;
              r.qkv_stride = width;
              r.a = ad.F(g);
              r.b = bd.F(g);
              r.ab_stride = abs_;
              r.a_log = ld.F(g);
              r.dt_bias = dd.F(g);
              set_states(g, r, run.state, run.snaps, run.table, ssz);
              r.state_dtype = sdt;
              r.out = run.out.F(g);
              r.out_stride = vd;
              GatedRmsNormParams& n = p.norm;
              n.rows = rows * sh.nv;
              n.dim = sh.dv;
              n.x = n.y = r.out;
              n.x_stride = n.y_stride = sh.dv;
              n.z = zd.F(g);
              n.z_stride = sh.dv;
              n.z_group = sh.nv;
              n.z_group_stride = P;
              n.weight = wd.F(g);
              n.eps = 1e-6f;
              if (conv) {
                Conv1dParams& c = p.conv;
                c.rows = rows;
                c.channels = C;
                c.kernel = 4;
                c.x = rawd.F(g);
                c.x_stride = xw;
                c.y = run.y.F(g);
                c.y_stride = width;
                c.weight = cwd.F(g);
                set_states(g, c, run.cstate, run.csnaps, run.ctable, csz);
                c.silu = true;
              }
              return p;
            };
            // A device table of the rows' state pointers, each `size`
            // elements of `elem` bytes apart.
            auto table = [&](const Dual& states, size_t size, size_t elem) {
              std::vector<void*> ptrs[2];
              for (bool g : {false, true}) {
                for (int i = 0; i < rows; ++i)
                  ptrs[g].push_back(static_cast<char*>(states.V(g)) +
                                    size_t(i) * size * elem);
              }
              Dual t = Up(ptrs[0].data(), rows * sizeof(float*));
              EXPECT_TRUE(gpu_->CopyToDevice(t.g.data(), ptrs[1].data(),
                                             rows * sizeof(float*))
                              .ok());
              return t;
            };
            // The rule's states in their storage type (bf16: st rounded).
            std::vector<uint16_t> st16(st.size());
            for (size_t i = 0; i < st.size(); ++i) {
              st16[i] = cpu::FloatToBf16(st[i]);
            }
            auto rule_states = [&](bool zero, size_t n) {
              if (!bf16) return zero ? Zeros(n) : UpF(st);
              return zero ? Up(std::vector<uint16_t>(n).data(), n * 2)
                          : Up(st16.data(), st16.size() * 2);
            };
            auto fresh = [&]() {
              Run r{rule_states(false, 0),
                    rule_states(true, size_t(rows) * ssz),
                    Dual{},
                    Zeros(size_t(rows) * vd),
                    UpF(cst),
                    Zeros(size_t(rows) * csz),
                    Dual{},
                    Zeros(size_t(rows) * width)};
              r.table = table(r.state, ssz, selem);
              r.ctable = table(r.cstate, csz, 4);
              return r;
            };
            // n rule-state elements of `d` as fp32 (bf16 widened exactly).
            auto down_states = [&](const Dual& d, bool g, size_t n) {
              if (!bf16) return Down(d, g, n);
              std::vector<uint16_t> h(n);
              EXPECT_TRUE(B(g)->CopyToHost(h.data(), d.V(g), n * 2).ok());
              std::vector<float> v(n);
              for (size_t i = 0; i < n; ++i) v[i] = cpu::Bf16ToFloat(h[i]);
              return v;
            };
            auto results = [&](bool g, const Run& r) {
              std::vector<float> v = Down(r.out, g, size_t(rows) * vd);
              auto add = [&](const std::vector<float>& s) {
                v.insert(v.end(), s.begin(), s.end());
              };
              add(mode == kSnapshots
                      ? down_states(r.snaps, g, size_t(rows) * ssz)
                      : down_states(r.state, g, size_t(slots) * ssz));
              if (conv) {
                add(mode == kSnapshots
                        ? Down(r.csnaps, g, size_t(rows) * csz)
                        : Down(r.cstate, g, size_t(slots) * csz));
                add(Down(r.y, g, size_t(rows) * width));
              }
              return v;
            };
            Run fused = fresh(), apart = fresh(), cpu = fresh();
            ASSERT_TRUE(gpu_->GatedDeltaRuleNormed(params(true, fused)).ok())
                << what;
            const GatedDeltaRuleNormParams pa = params(true, apart);
            if (conv) {
              ASSERT_TRUE(gpu_->Conv1d(pa.conv).ok()) << what;
            }
            ASSERT_TRUE(gpu_->GatedDeltaRule(pa.rule).ok()) << what;
            ASSERT_TRUE(gpu_->GatedRmsNorm(pa.norm).ok()) << what;
            const std::vector<float> f = results(true, fused),
                                     s = results(true, apart);
            ExpectBitEqual(f.data(), s.data(), f.size(),
                           what + " fused vs in turn");
            ASSERT_TRUE(cpu_->GatedDeltaRuleNormed(params(false, cpu)).ok())
                << what;
            ExpectClose(results(false, cpu), f, bf16 ? 1e-2 : 1e-4,
                        what + " cpu vs gpu");
          }
        }
      }
    }
  }
}

TEST_F(CudaBackendTest, GatedDeltaRuleNormedRejectsANormElsewhere) {
  GatedDeltaRuleNormParams p;
  GatedDeltaRuleParams& r = p.rule;
  Buffer buf = GpuZeros(1 << 16);
  float* f = buf.f32();
  r.rows = 1;
  r.num_k_heads = 1;
  r.num_v_heads = 1;
  r.k_head_dim = 128;
  r.v_head_dim = 128;
  r.q = r.k = r.v = f;
  r.qkv_stride = 384;
  r.a = r.b = f;
  r.ab_stride = 1;
  r.a_log = r.dt_bias = f;
  r.state_in = r.state_out = f + 4096;
  r.out = f + 1024;
  r.out_stride = 128;
  GatedRmsNormParams& n = p.norm;
  n.rows = 1;
  n.dim = 128;
  n.x = n.y = f + 2048;  // not the rule's output
  n.x_stride = n.y_stride = 128;
  n.z = f;
  n.z_stride = 128;
  n.weight = f;
  EXPECT_EQ(gpu_->GatedDeltaRuleNormed(p).code(),
            absl::StatusCode::kInvalidArgument);
  n.x = n.y = r.out;
  EXPECT_TRUE(gpu_->GatedDeltaRuleNormed(p).ok());
}

// ---------------------------------------------------------------- Elementwise

TEST_F(CudaBackendTest, SwigluAndEmbed) {
  for (int rows : kRows) {
    for (int dim : {1, 3, 7, 17, 1000}) {
      const int st = dim + 1;
      const std::vector<float> gt = Random(rows * st, -6, 6),
                               up = Random(rows * st);
      Dual gd = UpF(gt), ud = UpF(up), od = Zeros(rows * st);
      std::vector<float> res[2];
      for (bool g : {false, true}) {
        SwigluParams p;
        p.rows = rows;
        p.dim = dim;
        p.gate = gd.F(g);
        p.gate_stride = st;
        p.up = ud.F(g);
        p.up_stride = st;
        p.out = od.F(g);
        p.out_stride = st;
        ASSERT_TRUE(B(g)->Swiglu(p).ok());
        res[g] = Down(od, g, rows * st);
      }
      ExpectClose(res[0], res[1], 1e-6,
                  absl::StrCat("swiglu rows=", rows, " dim=", dim));
    }
  }
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const int vocab = 29, dim = 77;
    const std::vector<uint8_t> table = RandomWeights(vocab * dim, dtype);
    const std::vector<int32_t> ids = {3, 0, 28, 3, 17};
    const int rows = ids.size(), os = dim + 3;
    Dual td = Up(table.data(), table.size()),
         id = Up(ids.data(), ids.size() * 4), od = Zeros(rows * os);
    std::vector<float> res[2];
    for (bool g : {false, true}) {
      EmbedParams p;
      p.rows = rows;
      p.ids = static_cast<const int32_t*>(id.V(g));
      p.table_dtype = dtype;
      p.table = td.V(g);
      p.vocab = vocab;
      p.dim = dim;
      p.out = od.F(g);
      p.out_stride = os;
      ASSERT_TRUE(B(g)->Embed(p).ok());
      res[g] = Down(od, g, rows * os);
    }
    ExpectClose(res[0], res[1], 0, absl::StrCat("embed ", DTypeName(dtype)));
    // Out-of-range ids are rejected, as on the CPU.
    const int32_t bad[2] = {1, vocab};
    Dual bd = Up(bad, sizeof(bad));
    EmbedParams p;
    p.rows = 2;
    p.ids = static_cast<const int32_t*>(bd.g.data());
    p.table_dtype = dtype;
    p.table = td.g.data();
    p.vocab = vocab;
    p.dim = dim;
    p.out = od.g.f32();
    p.out_stride = os;
    // Out-of-range ids are reported at the next synchronization (the ids
    // are read on the device, with no host round trip per call); the row
    // is NaN, and the error is reported once.
    EXPECT_TRUE(gpu_->Embed(p).ok());
    EXPECT_EQ(gpu_->Synchronize().code(), absl::StatusCode::kOutOfRange);
    EXPECT_TRUE(gpu_->Synchronize().ok());
    const std::vector<float> got = DownG(od.g, rows * os);
    EXPECT_TRUE(std::isnan(got[os])) << "row of the bad id";
    EXPECT_FALSE(std::isnan(got[0])) << "row of the good id";
  }
}

// The tensor-core tile layout: which weights get it, the embedding read
// through it (every row of a table whose last tile and step are partial,
// against the CPU's row-major read: the index map is right), and the
// refusals of backends that cannot read it.
TEST_F(CudaBackendTest, WeightLayouts) {
  const int vocab = 300, dim = 136;  // 2 tiles + 44 rows; 2 steps + 8 k
  const std::vector<uint8_t> table = RandomWeights(vocab * dim, DType::kBF16);
  auto tiled = gpu_->UploadWeight(DType::kBF16, table.data(), vocab, dim);
  ASSERT_TRUE(tiled.ok()) << tiled.status();
  EXPECT_EQ(tiled->layout, WeightLayout::kTensorCoreTiles);
  EXPECT_EQ(tiled->bytes(), size_t{vocab} * dim * 2);  // the matrix's own bytes
  const std::vector<uint8_t> f32 = RandomWeights(8 * 16, DType::kF32);
  EXPECT_EQ(gpu_->UploadWeight(DType::kF32, f32.data(), 8, 16)->layout,
            WeightLayout::kRowMajor);
  const std::vector<uint8_t> odd = RandomWeights(8 * 12, DType::kBF16);
  EXPECT_EQ(gpu_->UploadWeight(DType::kBF16, odd.data(), 8, 12)->layout,
            WeightLayout::kRowMajor);  // (cols % 8 != 0: no tensor-core path)

  std::vector<int32_t> ids(vocab);
  for (int i = 0; i < vocab; ++i)
    ids[i] = (i * 37) % vocab;  // every row, out of order
  Dual id = Up(ids.data(), ids.size() * 4), od = Zeros(vocab * dim);
  Dual td = Up(table.data(), table.size());
  std::vector<float> res[2];
  for (bool g : {false, true}) {
    EmbedParams p;
    p.rows = vocab;
    p.ids = static_cast<const int32_t*>(id.V(g));
    p.vocab = vocab;
    p.dim = dim;
    p.table_dtype = DType::kBF16;
    p.table_layout = g ? tiled->layout : WeightLayout::kRowMajor;
    p.table = g ? tiled->data : td.c.data();
    p.out = od.F(g);
    p.out_stride = dim;
    ASSERT_TRUE(B(g)->Embed(p).ok());
    res[g] = Down(od, g, vocab * dim);
  }
  ExpectBitEqual(res[1].data(), res[0].data(), vocab * dim,
                 "embed from the tiled table");

  // The CPU backend reads row-major weights only.
  const std::vector<float> x = Random(dim);
  Dual xd = UpF(x), yd = Zeros(vocab);
  MatmulParams m = DenseMatmul(1, xd.F(false), *tiled, yd.F(false));
  EXPECT_EQ(cpu_->Matmul(m).code(), absl::StatusCode::kInvalidArgument);
  EmbedParams e;
  e.rows = 1;
  e.ids = ids.data();
  e.table_dtype = DType::kBF16;
  e.table_layout = WeightLayout::kTensorCoreTiles;
  e.table = table.data();
  e.vocab = vocab;
  e.dim = dim;
  e.out = od.F(false);
  e.out_stride = dim;
  EXPECT_EQ(cpu_->Embed(e).code(), absl::StatusCode::kInvalidArgument);
  // A CUDA backend without the tensor-core matmul keeps its weights
  // row-major and refuses tiled ones (they are not in the layout it reads).
  CudaBackendOptions options;
  options.matmul_x_splits = 0;
  auto plain = CreateCudaBackend(options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto rm = (*plain)->UploadWeight(DType::kBF16, table.data(), vocab, dim);
  ASSERT_TRUE(rm.ok()) << rm.status();
  EXPECT_EQ(rm->layout, WeightLayout::kRowMajor);
  m = DenseMatmul(1, xd.F(true), *tiled, yd.F(true));
  EXPECT_EQ((*plain)->Matmul(m).code(), absl::StatusCode::kInvalidArgument);
  // Its row-major matmul agrees with the tiled one within the CUDA-core
  // kernel's different order.
  ASSERT_TRUE(
      gpu_->Matmul(DenseMatmul(1, xd.F(true), *tiled, yd.F(true))).ok());
  const std::vector<float> want = DownG(yd.g, vocab);
  Buffer y2 = GpuZeros(vocab);
  ASSERT_TRUE((*plain)->Matmul(DenseMatmul(1, xd.F(true), *rm, y2.f32())).ok());
  ASSERT_TRUE((*plain)->Synchronize().ok());
  ExpectClose(DownG(y2, vocab), want, 1e-4, "row-major vs tiled matmul");
}

// ---------------------------------------------------------------- Reductions

TEST_F(CudaBackendTest, ArgmaxLogSumExpSoftmax) {
  for (int rows : kRows) {
    for (int cols : {1, 3, 7, 17, 1000, 151937}) {
      const std::string what = absl::StrCat("rows=", rows, " cols=", cols);
      const int xs = cols + 2;
      std::vector<float> x = Random(rows * xs, -10, 10);
      // Ties (first index must win); NaN and -inf rows are checked below.
      if (cols >= 7) {
        x[0 * xs + 5] = 11.0f;
        x[0 * xs + 2] = 11.0f;
        x[0 * xs + cols - 1] = 11.0f;
      }
      Dual xd = UpF(x), od = Zeros(rows * xs), id = Zeros(rows);
      std::vector<float> lse[2], sm[2];
      std::vector<int32_t> am[2];
      for (bool g : {false, true}) {
        ArgmaxParams ap;
        ap.rows = rows;
        ap.cols = cols;
        ap.x = xd.F(g);
        ap.x_stride = xs;
        ap.out = static_cast<int32_t*>(id.V(g));
        ASSERT_TRUE(B(g)->Argmax(ap).ok());
        am[g].resize(rows);
        ASSERT_TRUE(B(g)->CopyToHost(am[g].data(), id.V(g), rows * 4).ok());
        LogSumExpParams lp;
        lp.rows = rows;
        lp.cols = cols;
        lp.x = xd.F(g);
        lp.x_stride = xs;
        lp.out = od.F(g);
        lp.inv_temperature = 0.7f;
        ASSERT_TRUE(B(g)->LogSumExp(lp).ok());
        lse[g] = Down(od, g, rows);
        SoftmaxParams sp;
        sp.rows = rows;
        sp.cols = cols;
        sp.x = xd.F(g);
        sp.x_stride = xs;
        sp.y = od.F(g);
        sp.y_stride = xs;
        sp.inv_temperature = 0.7f;
        ASSERT_TRUE(B(g)->Softmax(sp).ok());
        sm[g] = Down(od, g, rows * xs);
      }
      EXPECT_EQ(am[0], am[1]) << "argmax " << what;
      ExpectClose(lse[0], lse[1], 1e-6, "logsumexp " + what);
      ExpectClose(sm[0], sm[1], 1e-6, "softmax " + what);
      // Rows alone.
      Buffer one = GpuZeros(xs);
      for (int t = 0; t < rows; ++t) {
        SoftmaxParams sp;
        sp.rows = 1;
        sp.cols = cols;
        sp.x = xd.g.f32() + t * xs;
        sp.x_stride = xs;
        sp.y = one.f32();
        sp.y_stride = xs;
        sp.inv_temperature = 0.7f;
        ASSERT_TRUE(gpu_->Softmax(sp).ok());
        ExpectBitEqual(DownG(one, cols).data(), sm[1].data() + t * xs, cols,
                       "softmax alone " + what);
        LogSumExpParams lp;
        lp.rows = 1;
        lp.cols = cols;
        lp.x = xd.g.f32() + t * xs;
        lp.x_stride = xs;
        lp.out = one.f32();
        lp.inv_temperature = 0.7f;
        ASSERT_TRUE(gpu_->LogSumExp(lp).ok());
        ExpectBitEqual(DownG(one, 1).data(), lse[1].data() + t, 1,
                       "lse alone " + what);
      }
    }
  }
  // NaN / -inf corner cases of argmax, against the CPU.
  const float inf = INFINITY, nan = NAN;
  const std::vector<float> x = {nan, 1,   2, 2,   -inf,  -inf, -inf, -inf,
                                0,   nan, 3, nan, -0.0f, 0.0f, -1,   -0.0f};
  Dual xd = UpF(x), id = Zeros(4), fd = Zeros(4);
  std::vector<int32_t> am[2], fin[2];
  for (bool g : {false, true}) {
    ArgmaxParams ap;
    ap.rows = 4;
    ap.cols = 4;
    ap.x = xd.F(g);
    ap.x_stride = 4;
    ap.out = static_cast<int32_t*>(id.V(g));
    ap.finite = static_cast<int32_t*>(fd.V(g));
    ASSERT_TRUE(B(g)->Argmax(ap).ok());
    am[g].resize(4);
    fin[g].resize(4);
    ASSERT_TRUE(B(g)->CopyToHost(am[g].data(), id.V(g), 16).ok());
    ASSERT_TRUE(B(g)->CopyToHost(fin[g].data(), fd.V(g), 16).ok());
  }
  EXPECT_EQ(am[0], am[1]) << "argmax corner cases";
  EXPECT_EQ(fin[1], (std::vector<int32_t>{0, 0, 0, 1})) << "finite flags";
  EXPECT_EQ(fin[0], fin[1]) << "finite flags, cpu vs cuda";
}

// ---------------------------------------------------------------- Memory

TEST_F(CudaBackendTest, MemoryOps) {
  auto z = gpu_->Allocate(1000);
  ASSERT_TRUE(z.ok());
  std::vector<uint8_t> got(1000, 7);
  ASSERT_TRUE(gpu_->CopyToHost(got.data(), z->data(), 1000).ok());
  EXPECT_EQ(got, std::vector<uint8_t>(1000, 0)) << "Allocate zero-fills";

  std::vector<float> v = Random(5000);
  Dual d = UpF(v);
  // Overlapping moves both ways behave as memmove.
  for (int shift : {-1, 1, -777, 777}) {
    std::vector<float> want = v;
    const int n = 3000, src = 1000, dst = src + shift;
    std::memmove(want.data() + dst, want.data() + src, n * 4);
    Dual e = UpF(v);
    ASSERT_TRUE(
        gpu_->CopyOnDevice(e.g.f32() + dst, e.g.f32() + src, n * 4).ok());
    EXPECT_EQ(Down(e, true, v.size()), want) << "memmove shift " << shift;
  }
  ASSERT_TRUE(gpu_->Zero(d.g.f32() + 10, 40).ok());
  std::vector<float> want = v;
  std::fill(want.begin() + 10, want.begin() + 20, 0.0f);
  EXPECT_EQ(Down(d, true, v.size()), want);
  ASSERT_TRUE(gpu_->Synchronize().ok());
}

}  // namespace
}  // namespace specserve::kernels::cuda
