// The CPU chunked gated delta rule (chunked_delta_rule.h, run as
// CpuBackend::PrefillGatedDeltaRule with chunked_prefill) against the exact
// per-token CPU rule on random problems: outputs and final state within
// kTolerance of max |·| for T across chunk boundaries, calls starting
// inside a chunk, nk != nv, odd and model head dims and a non-zero initial
// state (the measured errors are printed, and those against a float64
// per-token evaluation beside them); calls cut at multiples of the chunk
// (absolute positions) give one call's bits, as do a call's prefix, the
// thread count and a recorded call; other cuts stay within tolerance; the
// backend's fallbacks and refusals.
#include "kernels/cpu/chunked_delta_rule.h"

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
#include "kernels/cpu/convert.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/gated_delta_rule.h"

namespace specserve::kernels::cpu {
namespace {

constexpr int kChunk = static_cast<int>(kPrefillDeltaRuleChunk);

// max |chunked − exact| <= kTolerance · max |exact|, over a call's outputs
// and over its final state. Measured worst over MatchesExactRule's 90
// problems: 1.8e-6 (outputs) and 2.6e-6 (state), both in the fast-decay
// regime, where e^(G_t−G_s) is taken from a difference of cumulative sums
// near −100 that carries their rounding; the per-token rule itself is
// within 7.6e-7 of float64 there. The bound leaves a factor of two.
constexpr double kTolerance = 5e-6;

struct Shape {
  int nk, nv, dk, dv;
};
constexpr Shape kShapes[] = {
    {1, 3, 24, 40},    // odd dims, nv = 3·nk
    {2, 4, 128, 128},  // the model's head dims
    {2, 6, 12, 8},     // tiny_b's
};

// Decay regimes: A_log ~ U(lo, hi). Fast: g down to about −4 per token
// (e^G underflows within a chunk); slow: g about −0.01..−0.1, so the state
// keeps every token of a chunk and (I + A) is far from I.
struct Decay {
  const char* name;
  float a_log_lo, a_log_hi;
};
constexpr Decay kFast{"fast decay", -1.0f, 0.5f};
constexpr Decay kSlow{"slow decay", -5.0f, -3.0f};

const float kPoison = std::nanf("");

// One problem in the model's layout (worker/model/blocks.cc): a qkv row is
// [q nk·dk | k nk·dk | v nv·dv], an a/b row [z nv·dv | b nv | a nv] (z
// unused), out rows nv·dv wide.
struct Problem {
  Shape shape{};
  int rows = 0;
  int64_t position = 0;  // absolute position of row 0
  int64_t qkv_stride = 0, ab_stride = 0, out_stride = 0, state_size = 0;
  std::vector<float> qkv, ab, a_log, dt_bias, state;
};

struct Result {
  std::vector<float> out, state;
};

Problem Make(Shape s, int rows, int64_t position, const Decay& decay,
             uint32_t seed) {
  std::mt19937 rng(seed);
  auto random = [&](size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
  };
  Problem p;
  p.shape = s;
  p.rows = rows;
  p.position = position;
  p.qkv_stride = 2 * s.nk * s.dk + s.nv * s.dv;
  p.ab_stride = s.nv * s.dv + 2 * s.nv;
  p.out_stride = s.nv * s.dv;
  p.state_size = int64_t{s.nv} * s.dk * s.dv;
  p.qkv = random(rows * p.qkv_stride, -1.0f, 1.0f);
  p.ab = random(rows * p.ab_stride, -2.0f, 2.0f);
  p.a_log = random(s.nv, decay.a_log_lo, decay.a_log_hi);
  p.dt_bias = random(s.nv, -0.5f, 0.5f);
  p.state = random(p.state_size, -0.5f, 0.5f);
  return p;
}

// Rows [r0, r0 + rows) of p, reading state_in and writing state_out.
GatedDeltaRuleParams Params(const Problem& p, int64_t r0, int64_t rows,
                            const float* state_in, float* state_out,
                            float* out) {
  const Shape& s = p.shape;
  GatedDeltaRuleParams g;
  g.rows = rows;
  g.num_k_heads = s.nk;
  g.num_v_heads = s.nv;
  g.k_head_dim = s.dk;
  g.v_head_dim = s.dv;
  const float* qkv = p.qkv.data() + r0 * p.qkv_stride;
  g.q = qkv;
  g.k = qkv + s.nk * s.dk;
  g.v = qkv + 2 * s.nk * s.dk;
  g.qkv_stride = p.qkv_stride;
  const float* ab = p.ab.data() + r0 * p.ab_stride;
  g.b = ab + s.nv * s.dv;
  g.a = ab + s.nv * s.dv + s.nv;
  g.ab_stride = p.ab_stride;
  g.a_log = p.a_log.data();
  g.dt_bias = p.dt_bias.data();
  g.state_in = state_in;
  g.state_out = state_out;
  g.out = out + r0 * p.out_stride;
  g.out_stride = p.out_stride;
  g.position = p.position + r0;
  return g;
}

enum class Rule { kExact, kChunked };

// All of p's rows by `rule` on `be`, in calls delimited by `cuts`
// (increasing, inside (0, rows)), chained through the state in place; a
// single call runs out of place (and must leave state_in as it was).
Result RunCalls(Backend& be, Rule rule, const Problem& p,
                const std::vector<int>& cuts = {}) {
  Result r;
  r.out.assign(p.rows * p.out_stride, kPoison);
  std::vector<float> state = p.state;
  r.state.assign(p.state_size, kPoison);
  const bool in_place = !cuts.empty();
  std::vector<int> ends = cuts;
  ends.push_back(p.rows);
  int r0 = 0;
  for (int r1 : ends) {
    const GatedDeltaRuleParams g =
        Params(p, r0, r1 - r0, state.data(),
               in_place ? state.data() : r.state.data(), r.out.data());
    const absl::Status s = rule == Rule::kExact ? be.GatedDeltaRule(g)
                                                : be.PrefillGatedDeltaRule(g);
    EXPECT_TRUE(s.ok()) << s;
    r0 = r1;
  }
  if (in_place) {
    r.state = state;
  } else {
    EXPECT_TRUE(std::memcmp(state.data(), p.state.data(),
                            state.size() * sizeof(float)) == 0)
        << "state_in changed by an out-of-place call";
  }
  return r;
}

// The per-token rule (kernels/gated_delta_rule.h) in float64 from the same
// fp32 inputs: the yardstick both fp32 forms are measured against.
Result Float64Rule(const Problem& p) {
  const Shape& s = p.shape;
  const int64_t dk = s.dk, dv = s.dv, ratio = s.nv / s.nk;
  std::vector<double> S(p.state.begin(), p.state.end());
  std::vector<double> out(p.rows * p.out_stride);
  std::vector<double> qn(dk), kn(dk), u(dv);
  auto normalize = [](const float* x, int64_t n, double scale, double* y) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
    const double inv = 1.0 / std::sqrt(ss + 1e-6);
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * scale;
  };
  for (int64_t t = 0; t < p.rows; ++t) {
    const float* row = p.qkv.data() + t * p.qkv_stride;
    const float* ab = p.ab.data() + t * p.ab_stride + s.nv * s.dv;
    for (int64_t h = 0; h < s.nv; ++h) {
      const int64_t kh = h / ratio;
      normalize(row + kh * dk, dk, 1.0 / std::sqrt(double(dk)), qn.data());
      normalize(row + s.nk * dk + kh * dk, dk, 1.0, kn.data());
      const float* v = row + 2 * s.nk * dk + h * dv;
      const double beta = 1.0 / (1.0 + std::exp(-double(ab[h])));
      const double x = double(ab[s.nv + h]) + p.dt_bias[h];
      const double sp = x > 20.0 ? x : std::log1p(std::exp(x));
      const double decay = std::exp(-std::exp(double(p.a_log[h])) * sp);
      double* sh = S.data() + h * dk * dv;
      for (int64_t j = 0; j < dv; ++j) u[j] = 0;
      for (int64_t i = 0; i < dk; ++i) {
        for (int64_t j = 0; j < dv; ++j) {
          sh[i * dv + j] *= decay;
          u[j] += sh[i * dv + j] * kn[i];
        }
      }
      for (int64_t j = 0; j < dv; ++j) u[j] = beta * (v[j] - u[j]);
      double* o = out.data() + t * p.out_stride + h * dv;
      for (int64_t j = 0; j < dv; ++j) o[j] = 0;
      for (int64_t i = 0; i < dk; ++i) {
        for (int64_t j = 0; j < dv; ++j) {
          sh[i * dv + j] += kn[i] * u[j];
          o[j] += sh[i * dv + j] * qn[i];
        }
      }
    }
  }
  return {std::vector<float>(out.begin(), out.end()),
          std::vector<float>(S.begin(), S.end())};
}

// max |got − want| / max |want|; NaN (an unwritten output) is infinite.
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

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string Name(const Shape& s, int rows, int64_t position) {
  return absl::StrCat("nk=", s.nk, " nv=", s.nv, " dk=", s.dk, " dv=", s.dv,
                      " T=", rows, " position=", position);
}

CpuBackendOptions Chunked(int threads = 0) {
  CpuBackendOptions o;
  o.num_threads = threads;
  o.chunked_prefill = true;
  return o;
}

TEST(ChunkedDeltaRuleTest, MatchesExactRule) {
  CpuBackend exact, chunked(Chunked());
  EXPECT_TRUE(exact.ExactPrefill());
  EXPECT_FALSE(chunked.ExactPrefill());
  double worst_out = 0, worst_state = 0, worst_f64 = 0, exact_f64 = 0;
  uint32_t seed = 1;
  for (const Decay& decay : {kFast, kSlow}) {
    for (const Shape& s : kShapes) {
      for (int rows : {1, 63, 64, 65, 200}) {
        for (int64_t position : {0, 37, 128}) {
          const std::string what =
              absl::StrCat(decay.name, " ", Name(s, rows, position));
          SCOPED_TRACE(what);
          const Problem p = Make(s, rows, position, decay, seed++);
          const Result want = RunCalls(exact, Rule::kExact, p);
          const Result got = RunCalls(chunked, Rule::kChunked, p);
          const Result f64 = Float64Rule(p);
          const double e_out = MaxRelError(want.out, got.out);
          const double e_state = MaxRelError(want.state, got.state);
          const double c64 = std::max(MaxRelError(f64.out, got.out),
                                      MaxRelError(f64.state, got.state));
          const double x64 = std::max(MaxRelError(f64.out, want.out),
                                      MaxRelError(f64.state, want.state));
          std::printf(
              "%s: chunked vs exact out %.3g state %.3g; vs float64 chunked "
              "%.3g exact %.3g\n",
              what.c_str(), e_out, e_state, c64, x64);
          EXPECT_LE(e_out, kTolerance) << "out";
          EXPECT_LE(e_state, kTolerance) << "state";
          worst_out = std::max(worst_out, e_out);
          worst_state = std::max(worst_state, e_state);
          worst_f64 = std::max(worst_f64, c64);
          exact_f64 = std::max(exact_f64, x64);
        }
      }
    }
  }
  std::printf(
      "worst chunked vs exact: out %.3g, state %.3g (bound %.3g); vs float64: "
      "chunked %.3g, exact %.3g\n",
      worst_out, worst_state, kTolerance, worst_f64, exact_f64);
}

// Calls cut where position + cut is a multiple of the chunk give one call's
// bits (in place, chained through the state); other cuts stay within
// tolerance of the exact rule.
TEST(ChunkedDeltaRuleTest, CutsAtChunkBoundariesGiveOneCallsBits) {
  CpuBackend exact, chunked(Chunked());
  for (const Shape& s : {kShapes[0], kShapes[1]}) {
    for (int64_t position : {0, 37, 128}) {
      const int rows = 200;
      SCOPED_TRACE(Name(s, rows, position));
      const Problem p = Make(s, rows, position, kSlow, 77);
      const Result one = RunCalls(chunked, Rule::kChunked, p);
      // The first boundary after row 0, then every chunk.
      const int first = static_cast<int>((kChunk - position % kChunk) % kChunk);
      std::vector<int> all;
      for (int c = first == 0 ? kChunk : first; c < rows; c += kChunk) {
        all.push_back(c);
      }
      ASSERT_GE(all.size(), 2u);
      for (const std::vector<int>& cuts :
           {all, std::vector<int>{all[0]}, std::vector<int>{all[1]}}) {
        const Result split = RunCalls(chunked, Rule::kChunked, p, cuts);
        EXPECT_TRUE(BitEqual(one.out, split.out))
            << "out, cut at " << cuts[0] << " (" << cuts.size() << " cuts)";
        EXPECT_TRUE(BitEqual(one.state, split.state))
            << "state, cut at " << cuts[0] << " (" << cuts.size() << " cuts)";
      }
      const Result want = RunCalls(exact, Rule::kExact, p);
      for (const std::vector<int>& cuts :
           {std::vector<int>{1}, std::vector<int>{50, 100, 101},
            std::vector<int>{all[0] + 1, all[1] - 1}}) {
        const Result split = RunCalls(chunked, Rule::kChunked, p, cuts);
        const double e_out = MaxRelError(want.out, split.out);
        const double e_state = MaxRelError(want.state, split.state);
        std::printf("%s, %zu cuts from %d: vs exact out %.3g state %.3g\n",
                    Name(s, rows, position).c_str(), cuts.size(), cuts[0],
                    e_out, e_state);
        EXPECT_LE(e_out, kTolerance) << "cut at " << cuts[0];
        EXPECT_LE(e_state, kTolerance) << "cut at " << cuts[0];
      }
    }
  }
}

// A bf16 state (state_dtype): the chunked form runs each segment of the
// call (cut at the chunk grid) in fp32 from the widened state and rounds
// the state it hands on to nearest even: the fp32 form over the same
// segments, the state rounded between them, bit for bit; so cuts at chunk
// boundaries still give one call's bits.
TEST(ChunkedDeltaRuleTest, Bf16StateRoundsAtSegmentEnds) {
  CpuBackend chunked(Chunked());
  const int64_t position = 37;
  const int rows = 200;
  Problem p = Make(kShapes[0], rows, position, kSlow, 91);
  std::vector<uint16_t> st16(p.state_size);
  for (int64_t i = 0; i < p.state_size; ++i) {
    st16[i] = FloatToBf16(p.state[i]);
  }
  // bf16, one call, out of place.
  std::vector<float> out16(rows * p.out_stride, kPoison);
  std::vector<uint16_t> got16(p.state_size);
  GatedDeltaRuleParams g = Params(p, 0, rows, nullptr, nullptr, out16.data());
  g.state_in = st16.data();
  g.state_out = got16.data();
  g.state_dtype = DType::kBF16;
  ASSERT_TRUE(chunked.PrefillGatedDeltaRule(g).ok());
  // fp32 over the segments, rounding the state between them.
  std::vector<float> state(p.state_size), out(rows * p.out_stride, kPoison);
  for (int64_t i = 0; i < p.state_size; ++i) state[i] = Bf16ToFloat(st16[i]);
  std::vector<int> ends;
  for (int c = kChunk - position % kChunk; c < rows; c += kChunk) {
    ends.push_back(c);
  }
  ends.push_back(rows);
  int r0 = 0;
  for (int r1 : ends) {
    ASSERT_TRUE(chunked
                    .PrefillGatedDeltaRule(Params(p, r0, r1 - r0, state.data(),
                                                  state.data(), out.data()))
                    .ok());
    for (float& x : state) x = Bf16ToFloat(FloatToBf16(x));
    r0 = r1;
  }
  EXPECT_TRUE(BitEqual(out, out16)) << "outputs";
  std::vector<uint16_t> want16(p.state_size);
  for (int64_t i = 0; i < p.state_size; ++i) want16[i] = FloatToBf16(state[i]);
  EXPECT_EQ(got16, want16) << "final state";
  // Cut at the second chunk boundary, in place: the same bits.
  std::vector<uint16_t> chain = st16;
  std::vector<float> out_cut(rows * p.out_stride, kPoison);
  r0 = 0;
  for (int r1 : {ends[1], rows}) {
    GatedDeltaRuleParams c =
        Params(p, r0, r1 - r0, nullptr, nullptr, out_cut.data());
    c.state_in = c.state_out = chain.data();
    c.state_dtype = DType::kBF16;
    ASSERT_TRUE(chunked.PrefillGatedDeltaRule(c).ok());
    r0 = r1;
  }
  EXPECT_TRUE(BitEqual(out_cut, out16)) << "outputs, cut at " << ends[1];
  EXPECT_EQ(chain, got16) << "state, cut at " << ends[1];
}

// A token's output depends on nothing after it: a call over a prefix of
// the rows gives the prefix's bits of the whole call, wherever it ends.
TEST(ChunkedDeltaRuleTest, PrefixGivesTheSameBits) {
  CpuBackend chunked(Chunked());
  for (int64_t position : {0, 37}) {
    const Problem p = Make(kShapes[0], 200, position, kSlow, 5);
    const Result whole = RunCalls(chunked, Rule::kChunked, p);
    for (int rows : {1, 27, 100, 150}) {
      Problem q = p;
      q.rows = rows;
      const Result part = RunCalls(chunked, Rule::kChunked, q);
      EXPECT_TRUE(std::memcmp(part.out.data(), whole.out.data(),
                              part.out.size() * sizeof(float)) == 0)
          << "position " << position << ", prefix of " << rows << " rows";
    }
  }
}

TEST(ChunkedDeltaRuleTest, ThreadCountDoesNotChangeBits) {
  CpuBackend one(Chunked(1)), three(Chunked(3));
  const Problem p = Make(kShapes[1], 130, 37, kFast, 9);
  const Result a = RunCalls(one, Rule::kChunked, p);
  const Result b = RunCalls(three, Rule::kChunked, p);
  EXPECT_TRUE(BitEqual(a.out, b.out));
  EXPECT_TRUE(BitEqual(a.state, b.state));
}

// Recorded and replayed, the chunked form gives a direct call's bits.
TEST(ChunkedDeltaRuleTest, RecordedCallGivesTheSameBits) {
  CpuBackendOptions o = Chunked();
  o.recording = true;
  CpuBackend be(o);
  const Problem p = Make(kShapes[0], 70, 37, kSlow, 11);
  const Result direct = RunCalls(be, Rule::kChunked, p);
  Result r;
  r.out.assign(p.rows * p.out_stride, kPoison);
  r.state.assign(p.state_size, kPoison);
  ASSERT_TRUE(be.BeginRecording().ok());
  ASSERT_TRUE(be.PrefillGatedDeltaRule(Params(p, 0, p.rows, p.state.data(),
                                              r.state.data(), r.out.data()))
                  .ok());
  auto rec = be.EndRecording();
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_TRUE(std::isnan(r.out[0])) << "ran while recording";
  ASSERT_TRUE(be.Replay(**rec).ok());
  EXPECT_TRUE(BitEqual(direct.out, r.out));
  EXPECT_TRUE(BitEqual(direct.state, r.state));
}

// Without the option, and for snapshots or session batches with it, the
// prefill form is the exact rule bit for bit; a negative position is
// refused.
TEST(ChunkedDeltaRuleTest, FallbacksAreTheExactRule) {
  CpuBackend exact, chunked(Chunked());
  const Problem p = Make(kShapes[0], 70, 37, kSlow, 13);
  const Result want = RunCalls(exact, Rule::kExact, p);
  EXPECT_TRUE(BitEqual(want.out, RunCalls(exact, Rule::kChunked, p).out));

  // Snapshots: state after row t at t·state_size.
  std::vector<float> snaps(p.rows * p.state_size), out(p.rows * p.out_stride);
  GatedDeltaRuleParams g =
      Params(p, 0, p.rows, p.state.data(), snaps.data(), out.data());
  g.state_out_stride = p.state_size;
  ASSERT_TRUE(chunked.PrefillGatedDeltaRule(g).ok());
  EXPECT_TRUE(BitEqual(want.out, out));
  EXPECT_TRUE(std::memcmp(snaps.data() + (p.rows - 1) * p.state_size,
                          want.state.data(),
                          want.state.size() * sizeof(float)) == 0);

  // A session batch of one session's rows, state in place.
  std::vector<float> state = p.state;
  std::vector<void*> states(p.rows, state.data());
  g = Params(p, 0, p.rows, nullptr, nullptr, out.data());
  g.states = states.data();
  std::fill(out.begin(), out.end(), kPoison);
  ASSERT_TRUE(chunked.PrefillGatedDeltaRule(g).ok());
  EXPECT_TRUE(BitEqual(want.out, out));
  EXPECT_TRUE(BitEqual(want.state, state));

  g = Params(p, 0, p.rows, p.state.data(), state.data(), out.data());
  g.position = -1;
  EXPECT_EQ(chunked.PrefillGatedDeltaRule(g).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specserve::kernels::cpu
