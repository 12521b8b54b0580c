// The prefill gated delta rule (CudaBackend::PrefillGatedDeltaRule: the
// chunked form of prefill_chunked_delta_rule.cu for dk = 128, else the
// per-token kernel of prefill_gated_delta_rule.cu) against the CPU
// backend's exact fp32 rule and the exact CUDA kernel (gated_delta_rule.cu),
// in the model's strided q/k/v and a/b layout, in place and out of place:
// within 1e-4 of max |·| (the chunked form's tf32: 3e-3), NaN-free, every
// output written; splits of the tokens into calls (at chunk boundaries for
// the chunked form) give one call's bits; determinism; refusals; a bf16
// recurrent state against the CPU with the same state type (and its chunked
// form). Its speed is tools/cuda_bench/prefill_ops_bench's. Every test skips
// when no CUDA device is visible.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/ops.h"
#include "kernels/gated_delta_rule.h"

namespace specserve::kernels::cuda {
namespace {

struct Shape {
  int nk, nv, dk, dv;
};
constexpr Shape kQwen27B{16, 48, 128, 128};  // the hot shape
constexpr Shape kSmall{2, 4, 64, 64};        // the small default model

// max |got − want| <= 1e-4 · max |want| over a call's outputs, and over its
// final state, for the per-token prefill kernel; the chunked form (dk =
// 128) rounds its mma operands to tf32 (2^-11 relative), hence its own
// bound.
constexpr double kTolerance = 1e-4;
constexpr double kChunkedTolerance = 3e-3;
constexpr int kChunk = static_cast<int>(kPrefillDeltaRuleChunk);

// The chunked form runs dk = 128 (LaunchPrefillChunkedDeltaRule).
bool Chunked(const Shape& s) { return s.dk == 128 && s.dv % 64 == 0; }
double ToleranceOf(const Shape& s) {
  return Chunked(s) ? kChunkedTolerance : kTolerance;
}

const float kPoison = std::nanf("");

// One problem's inputs, the same on every backend. Layout of
// worker/model/blocks.cc (LinearAttentionBlock): a qkv row is the conv's
// output [q nk·dk | k nk·dk | v nv·dv]; an a/b row is the in-projection's
// tail [z nv·dv | b nv | a nv] (z unused here); out rows are nv·dv wide.
struct Problem {
  Shape shape;
  int rows = 0;          // T
  int64_t position = 0;  // absolute position of row 0
  int64_t qkv_stride = 0, ab_stride = 0, out_stride = 0, state_size = 0;
  std::vector<float> qkv, ab, a_log, dt_bias, state;
};

// A problem's buffers on one backend.
struct Buffers {
  Buffer qkv, ab, a_log, dt_bias, state_in, state_out, out;
};

// One call's results.
struct Result {
  std::vector<float> out, state;
};

// max |got − want| / max |want| (at least 1e-30 below); NaN counts as
// infinite.
double MaxRelError(const std::vector<float>& want,
                   const std::vector<float>& got) {
  double scale = 1e-30, worst = 0.0;
  for (float w : want) scale = std::max(scale, std::fabs(double(w)));
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::fabs(double(got[i]) - double(want[i]));
    if (!(d <= worst)) worst = std::isnan(d) ? INFINITY : d;
  }
  return worst / scale;
}

bool HasNaN(const std::vector<float>& v) {
  return std::any_of(v.begin(), v.end(), [](float x) { return std::isnan(x); });
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Which implementation runs a call: the CPU, the exact CUDA kernel, the
// backend's prefill choice, the per-token prefill kernel itself, the CPU's
// chunked form (CpuBackendOptions::chunked_prefill).
enum class Rule { kCpu, kExact, kPrefill, kPerToken, kCpuChunked };

class PrefillGatedDeltaRuleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
    auto b = CreateCudaBackend(0);
    ASSERT_TRUE(b.ok()) << b.status();
    gpu_ = std::move(*b);
    cpu_ = std::make_unique<cpu::CpuBackend>();
    cpu::CpuBackendOptions chunked;
    chunked.chunked_prefill = true;
    cpu_chunked_ = std::make_unique<cpu::CpuBackend>(chunked);
  }

  Backend* B(Rule r) {
    if (r == Rule::kCpu) return cpu_.get();
    if (r == Rule::kCpuChunked) return cpu_chunked_.get();
    return gpu_.get();
  }
  cudaStream_t stream() {
    return static_cast<CudaBackend*>(gpu_.get())->stream();
  }

  std::vector<float> Random(size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }

  // q, k, v ~ U(-1, 1), a, b ~ U(-2, 2), A_log ~ U(-1, 0.5), dt_bias ~
  // U(-0.5, 0.5), the initial state ~ U(-0.1, 0.1).
  Problem Make(Shape s, int rows) {
    Problem p;
    p.shape = s;
    p.rows = rows;
    p.qkv_stride = 2 * s.nk * s.dk + s.nv * s.dv;
    p.ab_stride = s.nv * s.dv + 2 * s.nv;
    p.out_stride = s.nv * s.dv;
    p.state_size = int64_t{s.nv} * s.dk * s.dv;
    p.qkv = Random(rows * p.qkv_stride, -1.0f, 1.0f);
    p.ab = Random(rows * p.ab_stride, -2.0f, 2.0f);
    p.a_log = Random(s.nv, -1.0f, 0.5f);
    p.dt_bias = Random(s.nv, -0.5f, 0.5f);
    p.state = Random(p.state_size, -0.1f, 0.1f);
    if (state_dtype_ == DType::kBF16) {  // values a bf16 state holds
      for (float& x : p.state) x = cpu::Bf16ToFloat(cpu::FloatToBf16(x));
    }
    return p;
  }

  // A state in state_dtype_ on `be` (bf16: p.state's values, exactly).
  Buffer UpState(Backend* be, const std::vector<float>& v) {
    if (state_dtype_ != DType::kBF16) return Up(be, v);
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = cpu::FloatToBf16(v[i]);
    auto b = be->Allocate(h.size() * 2);
    EXPECT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(be->CopyToDevice(b->data(), h.data(), h.size() * 2).ok());
    return std::move(*b);
  }
  // n state elements as fp32 (bf16 widened exactly).
  std::vector<float> DownState(Backend* be, const Buffer& b, size_t n) {
    if (state_dtype_ != DType::kBF16) return Down(be, b.f32(), n);
    std::vector<uint16_t> h(n);
    EXPECT_TRUE(be->CopyToHost(h.data(), b.data(), n * 2).ok());
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = cpu::Bf16ToFloat(h[i]);
    return v;
  }

  Buffer Up(Backend* be, const std::vector<float>& v) {
    auto b = be->AllocateFloats(v.size());
    EXPECT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(be->CopyToDevice(b->data(), v.data(), v.size() * 4).ok());
    return std::move(*b);
  }
  std::vector<float> Down(Backend* be, const float* src, size_t n) {
    std::vector<float> v(n);
    EXPECT_TRUE(be->CopyToHost(v.data(), src, n * 4).ok());
    return v;
  }

  // The problem's inputs on `be`, out poisoned (NaN); in place: state_out
  // is state_in.
  Buffers Upload(Backend* be, const Problem& p, bool in_place) {
    Buffers b;
    b.qkv = Up(be, p.qkv);
    b.ab = Up(be, p.ab);
    b.a_log = Up(be, p.a_log);
    b.dt_bias = Up(be, p.dt_bias);
    b.state_in = UpState(be, p.state);
    if (!in_place) {
      b.state_out = UpState(be, std::vector<float>(p.state_size, kPoison));
    }
    b.out = Up(be, std::vector<float>(p.rows * p.out_stride, kPoison));
    return b;
  }

  // Tokens [r0, r0 + rows) of the problem, from the state in b.state_in.
  GatedDeltaRuleParams Params(const Problem& p, const Buffers& b, bool in_place,
                              int64_t r0, int64_t rows) const {
    const Shape& s = p.shape;
    GatedDeltaRuleParams g;
    g.rows = rows;
    g.num_k_heads = s.nk;
    g.num_v_heads = s.nv;
    g.k_head_dim = s.dk;
    g.v_head_dim = s.dv;
    float* qkv = b.qkv.f32() + r0 * p.qkv_stride;
    g.q = qkv;
    g.k = qkv + s.nk * s.dk;
    g.v = qkv + 2 * s.nk * s.dk;
    g.qkv_stride = p.qkv_stride;
    float* ab = b.ab.f32() + r0 * p.ab_stride;
    g.b = ab + s.nv * s.dv;
    g.a = ab + s.nv * s.dv + s.nv;
    g.ab_stride = p.ab_stride;
    g.a_log = b.a_log.f32();
    g.dt_bias = b.dt_bias.f32();
    g.state_in = b.state_in.data();
    g.state_out = in_place ? b.state_in.data() : b.state_out.data();
    g.state_dtype = state_dtype_;
    g.out = b.out.f32() + r0 * p.out_stride;
    g.out_stride = p.out_stride;
    g.position = p.position + r0;
    return g;
  }

  absl::Status Call(Rule r, const GatedDeltaRuleParams& g) {
    switch (r) {
      case Rule::kCpu:
        return cpu_->GatedDeltaRule(g);
      case Rule::kExact:
        return gpu_->GatedDeltaRule(g);
      case Rule::kPrefill:
        return gpu_->PrefillGatedDeltaRule(g);
      case Rule::kPerToken: {
        const absl::Status s = LaunchPrefillGatedDeltaRule(g, stream());
        return s.ok() ? gpu_->Synchronize() : s;
      }
      case Rule::kCpuChunked:
        return cpu_chunked_->PrefillGatedDeltaRule(g);
    }
    return absl::InternalError("unknown rule");
  }

  // All the problem's tokens by `r`, in calls of the token ranges that
  // `cuts` (increasing, inside (0, T)) delimit, chained through the state.
  // Out of place (one call only): checks that state_in is left as it was.
  Result Run(Rule r, const Problem& p, bool in_place,
             const std::vector<int>& cuts = {}) {
    Backend* be = B(r);
    Buffers b = Upload(be, p, in_place);
    std::vector<int> ends = cuts;
    ends.push_back(p.rows);
    int r0 = 0;
    for (int r1 : ends) {
      const absl::Status s = Call(r, Params(p, b, in_place, r0, r1 - r0));
      EXPECT_TRUE(s.ok()) << s;
      r0 = r1;
    }
    Result res;
    res.out = Down(be, b.out.f32(), p.rows * p.out_stride);
    res.state =
        DownState(be, in_place ? b.state_in : b.state_out, p.state_size);
    if (!in_place) {
      EXPECT_TRUE(BitEqual(DownState(be, b.state_in, p.state_size), p.state))
          << "state_in changed by an out-of-place call";
    }
    return res;
  }

  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<Backend> cpu_chunked_;
  DType state_dtype_ = DType::kF32;  // the states of Make, Upload and Params
  std::mt19937 rng_{20250301};
};

std::string Name(const Shape& s, int rows) {
  return absl::StrCat("nk=", s.nk, " nv=", s.nv, " dk=", s.dk, " dv=", s.dv,
                      " T=", rows);
}

// `got` within `tolerance` of `want` (out and state), NaN-free.
void ExpectClose(const Result& want, const Result& got, const std::string& what,
                 double tolerance = kTolerance) {
  ASSERT_FALSE(HasNaN(got.out)) << what << ": NaN (or unwritten) output";
  ASSERT_FALSE(HasNaN(got.state)) << what << ": NaN (or unwritten) state";
  const double e_out = MaxRelError(want.out, got.out);
  const double e_state = MaxRelError(want.state, got.state);
  std::printf("%s: max rel error out %.3g, state %.3g\n", what.c_str(), e_out,
              e_state);
  EXPECT_LE(e_out, tolerance) << what << " out";
  EXPECT_LE(e_state, tolerance) << what << " state";
}

TEST_F(PrefillGatedDeltaRuleTest, MatchesCpuAndExactKernel) {
  for (Shape s : {kQwen27B, kSmall}) {
    for (int rows : {1, 5, 64, 300, 2000}) {
      const std::string what = Name(s, rows);
      const Problem p = Make(s, rows);
      const Result cpu = Run(Rule::kCpu, p, /*in_place=*/false);
      const Result exact = Run(Rule::kExact, p, /*in_place=*/false);
      ASSERT_FALSE(HasNaN(cpu.out) || HasNaN(cpu.state)) << what;
      const Result out_of_place = Run(Rule::kPrefill, p, /*in_place=*/false);
      const Result in_place = Run(Rule::kPrefill, p, /*in_place=*/true);
      const double tol = ToleranceOf(s);
      ExpectClose(cpu, out_of_place, what + " prefill vs cpu", tol);
      ExpectClose(exact, out_of_place, what + " prefill vs exact kernel", tol);
      ExpectClose(cpu, in_place, what + " prefill in place vs cpu", tol);
      if (Chunked(s)) {  // the per-token kernel too, at the hot shape
        ExpectClose(cpu, Run(Rule::kPerToken, p, false),
                    what + " per-token prefill vs cpu");
      }
      EXPECT_TRUE(BitEqual(in_place.out, out_of_place.out) &&
                  BitEqual(in_place.state, out_of_place.state))
          << what << ": in place and out of place differ";
    }
  }
}

// Shapes past the two models' (dk, dv multiples of 32 up to 256, several
// value heads per key head) against the CPU.
TEST_F(PrefillGatedDeltaRuleTest, OtherShapesMatchCpu) {
  for (Shape s :
       {Shape{1, 3, 32, 96}, Shape{2, 2, 256, 64}, Shape{1, 2, 96, 32},
        Shape{2, 6, 160, 256}, Shape{4, 8, 128, 64}}) {
    for (int rows : {3, 37}) {
      const Problem p = Make(s, rows);
      ExpectClose(Run(Rule::kCpu, p, false), Run(Rule::kPrefill, p, false),
                  Name(s, rows) + " prefill vs cpu", ToleranceOf(s));
    }
  }
}

// One call, calls chained through the state in place, and the one call
// again: the same bits. The per-token kernel (dk = 64) takes any cuts; the
// chunked form (dk = 128) cuts at chunk boundaries of absolute positions,
// also for a prompt that starts inside a chunk, and stays within tolerance
// of the CPU for cuts inside a chunk.
TEST_F(PrefillGatedDeltaRuleTest, ChunkedCallsAndRepeatsGiveOneCallsBits) {
  struct Case {
    Shape shape;
    int64_t position;
    std::vector<std::vector<int>> cuts;
  };
  const Case kCases[] = {
      {kSmall, 0, {{1, 700}, {999, 1000, 1031}}},
      {kQwen27B, 0, {{kChunk, 11 * kChunk}, {15 * kChunk, 16 * kChunk}}},
      // Row 0 at position 37: chunk boundaries at rows 27, 91, ...
      {kQwen27B, 37, {{27, 91}, {27 + 15 * kChunk}}},
  };
  for (const Case& c : kCases) {
    Problem p = Make(c.shape, 2000);
    p.position = c.position;
    const std::string what =
        absl::StrCat(Name(c.shape, 2000), " position=", c.position);
    const Result one = Run(Rule::kPrefill, p, /*in_place=*/true);
    const Result again = Run(Rule::kPrefill, p, true);
    EXPECT_TRUE(BitEqual(one.out, again.out)) << what << ": repeat out";
    EXPECT_TRUE(BitEqual(one.state, again.state)) << what << ": repeat state";
    for (const std::vector<int>& cuts : c.cuts) {
      const Result split = Run(Rule::kPrefill, p, true, cuts);
      EXPECT_TRUE(BitEqual(one.out, split.out)) << what << ": split out";
      EXPECT_TRUE(BitEqual(one.state, split.state)) << what << ": split state";
    }
    if (Chunked(c.shape)) {
      const Result cpu = Run(Rule::kCpu, p, false);
      ExpectClose(cpu, one, what + " one call vs cpu", kChunkedTolerance);
      ExpectClose(cpu, Run(Rule::kPrefill, p, true, {1, 700, 1001}),
                  what + " cuts inside chunks vs cpu", kChunkedTolerance);
    }
  }
}

// Several sessions' calls in one (PrefillGatedDeltaRuleSlices, a
// PrefillBatch pass: short calls far into their sequences among them) ==
// each call alone, outputs and states bit for bit; for the chunked shape
// through the slice kernel itself and over more calls than one launch's
// table holds.
TEST_F(PrefillGatedDeltaRuleTest, SlicesEqualEachAlone) {
  for (Shape shape : {kQwen27B, kSmall}) {
    std::vector<std::pair<int, int64_t>> calls = {
        {64, 8192}, {1, 0}, {130, 37}, {64, 64}, {200, 5}, {7, 500}};
    if (Chunked(shape)) {
      for (int i = 0; i < 30; ++i) calls.push_back({1 + 13 * i % 70, 3 * i});
    }
    std::vector<Problem> problems;
    for (const auto& [rows, position] : calls) {
      problems.push_back(Make(shape, rows));
      problems.back().position = position;
    }
    // Every call reads the first problem's gates (one layer's weights).
    auto params = [&](std::vector<Buffers>* bufs) {
      std::vector<GatedDeltaRuleParams> out;
      for (size_t i = 0; i < problems.size(); ++i) {
        bufs->push_back(Upload(gpu_.get(), problems[i], /*in_place=*/true));
      }
      for (size_t i = 0; i < problems.size(); ++i) {
        GatedDeltaRuleParams g =
            Params(problems[i], (*bufs)[i], true, 0, problems[i].rows);
        g.a_log = (*bufs)[0].a_log.f32();
        g.dt_bias = (*bufs)[0].dt_bias.f32();
        out.push_back(g);
      }
      return out;
    };
    auto results = [&](const std::vector<Buffers>& bufs) {
      std::vector<Result> r;
      for (size_t i = 0; i < problems.size(); ++i) {
        const Problem& p = problems[i];
        r.push_back({Down(gpu_.get(), bufs[i].out.f32(), p.rows * p.out_stride),
                     DownState(gpu_.get(), bufs[i].state_in, p.state_size)});
      }
      return r;
    };
    std::vector<Buffers> alone_bufs, together_bufs;
    for (const GatedDeltaRuleParams& g : params(&alone_bufs)) {
      ASSERT_TRUE(gpu_->PrefillGatedDeltaRule(g).ok());
    }
    const std::vector<Result> alone = results(alone_bufs);
    const std::vector<GatedDeltaRuleParams> together = params(&together_bufs);
    if (Chunked(shape)) {
      ASSERT_TRUE(LaunchPrefillChunkedDeltaRuleSlices(together, stream()).ok());
      ASSERT_TRUE(gpu_->Synchronize().ok());
    } else {
      ASSERT_TRUE(gpu_->PrefillGatedDeltaRuleSlices(together).ok());
    }
    const std::vector<Result> got = results(together_bufs);
    for (size_t i = 0; i < problems.size(); ++i) {
      const std::string what =
          absl::StrCat(Name(shape, problems[i].rows), " at ",
                       problems[i].position, ", call ", i);
      EXPECT_TRUE(BitEqual(alone[i].out, got[i].out)) << what << ": out";
      EXPECT_TRUE(BitEqual(alone[i].state, got[i].state)) << what << ": state";
    }
  }
}

// A bf16 state (rounded after every token by the per-token kernels, at
// chunk ends by the chunked forms): the GPU's prefill against the CPU with
// the same state type (the exact rule; for dk = 128 also the CPU's chunked
// form, whose rounding points are the GPU's), within a bound that allows
// the two to round a state element differently; splits give one call's
// bits (any cuts for the per-token kernel, chunk boundaries for the
// chunked form).
TEST_F(PrefillGatedDeltaRuleTest, Bf16StateMatchesCpu) {
  state_dtype_ = DType::kBF16;
  constexpr double kBf16Tolerance = 2e-2;
  for (Shape s : {kQwen27B, kSmall}) {
    for (int rows : {1, 5, 64, 300}) {
      const std::string what = Name(s, rows) + " bf16 state";
      const Problem p = Make(s, rows);
      const Result cpu = Run(Rule::kCpu, p, /*in_place=*/false);
      const Result exact = Run(Rule::kExact, p, false);
      const Result prefill = Run(Rule::kPrefill, p, false);
      ExpectClose(cpu, exact, what + " exact kernel vs cpu", kBf16Tolerance);
      ExpectClose(cpu, prefill, what + " prefill vs cpu", kBf16Tolerance);
      if (Chunked(s)) {
        ExpectClose(Run(Rule::kCpuChunked, p, false), prefill,
                    what + " prefill vs cpu chunked", kBf16Tolerance);
        ExpectClose(cpu, Run(Rule::kPerToken, p, false),
                    what + " per-token prefill vs cpu", kBf16Tolerance);
      }
      const Result in_place = Run(Rule::kPrefill, p, true);
      EXPECT_TRUE(BitEqual(in_place.out, prefill.out) &&
                  BitEqual(in_place.state, prefill.state))
          << what << ": in place and out of place differ";
    }
  }
  Problem p = Make(kSmall, 300);
  const Result one = Run(Rule::kPrefill, p, true);
  const Result split = Run(Rule::kPrefill, p, true, {1, 100, 101});
  EXPECT_TRUE(BitEqual(one.out, split.out) && BitEqual(one.state, split.state))
      << "bf16 state, per-token prefill split";
  p = Make(kQwen27B, 300);
  p.position = 37;
  const Result one_c = Run(Rule::kPrefill, p, true);
  const Result split_c = Run(Rule::kPrefill, p, true, {27, 91});
  EXPECT_TRUE(BitEqual(one_c.out, split_c.out) &&
              BitEqual(one_c.state, split_c.state))
      << "bf16 state, chunked prefill split at chunk boundaries";
}

TEST_F(PrefillGatedDeltaRuleTest, Refusals) {
  const Problem p = Make(kSmall, 4);
  Buffers b = Upload(gpu_.get(), p, /*in_place=*/false);
  const GatedDeltaRuleParams ok = Params(p, b, false, 0, p.rows);
  ASSERT_TRUE(LaunchPrefillGatedDeltaRule(ok, stream()).ok());

  // A session batch: UNIMPLEMENTED (the backend runs GatedDeltaRule).
  auto tables = gpu_->Allocate(p.rows * sizeof(float*));
  ASSERT_TRUE(tables.ok());
  GatedDeltaRuleParams batch = ok;
  batch.states = reinterpret_cast<void* const*>(tables->data());
  batch.state_in = nullptr;
  batch.state_out = nullptr;
  EXPECT_EQ(LaunchPrefillGatedDeltaRule(batch, stream()).code(),
            absl::StatusCode::kUnimplemented);

  // Snapshots per token: UNIMPLEMENTED.
  auto snaps = gpu_->AllocateFloats(p.rows * p.state_size);
  ASSERT_TRUE(snaps.ok());
  GatedDeltaRuleParams snap = ok;
  snap.state_out = snaps->f32();
  snap.state_out_stride = p.state_size;
  EXPECT_EQ(LaunchPrefillGatedDeltaRule(snap, stream()).code(),
            absl::StatusCode::kUnimplemented);

  // Head dims this kernel does not run: UNIMPLEMENTED.
  for (auto [dk, dv] :
       {std::pair<int, int>{48, 64}, {64, 48}, {288, 64}, {64, 288}}) {
    GatedDeltaRuleParams odd = ok;
    odd.k_head_dim = dk;
    odd.v_head_dim = dv;
    odd.out_stride = p.shape.nv * dv;
    EXPECT_EQ(LaunchPrefillGatedDeltaRule(odd, stream()).code(),
              absl::StatusCode::kUnimplemented)
        << "dk=" << dk << " dv=" << dv;
  }

  // The chunked form runs dk = 128 only: UNIMPLEMENTED here (dk = 64).
  EXPECT_EQ(LaunchPrefillChunkedDeltaRule(ok, stream()).code(),
            absl::StatusCode::kUnimplemented);

  // Invalid params: INVALID_ARGUMENT.
  GatedDeltaRuleParams bad = ok;
  bad.rows = 0;
  EXPECT_EQ(LaunchPrefillGatedDeltaRule(bad, stream()).code(),
            absl::StatusCode::kInvalidArgument);
  bad = ok;
  bad.num_v_heads = 3;  // not a multiple of nk = 2
  EXPECT_EQ(LaunchPrefillGatedDeltaRule(bad, stream()).code(),
            absl::StatusCode::kInvalidArgument);
  bad = ok;
  bad.q = nullptr;
  EXPECT_EQ(LaunchPrefillGatedDeltaRule(bad, stream()).code(),
            absl::StatusCode::kInvalidArgument);
  bad = ok;
  bad.out_stride = p.shape.nv * p.shape.dv - 1;
  EXPECT_EQ(LaunchPrefillGatedDeltaRule(bad, stream()).code(),
            absl::StatusCode::kInvalidArgument);
  bad = ok;
  bad.state_out_stride = p.state_size;  // snapshots over state_in
  bad.state_out = const_cast<void*>(bad.state_in);
  EXPECT_EQ(LaunchPrefillGatedDeltaRule(bad, stream()).code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing above launched a faulting kernel.
  EXPECT_TRUE(gpu_->Synchronize().ok());
}

}  // namespace
}  // namespace specserve::kernels::cuda
