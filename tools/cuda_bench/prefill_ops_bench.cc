// Benchmark of the CUDA prefill kernels at the Qwen3.5-27B shapes, on random
// device data, timed with CUDA events (their correctness is
// kernels/cuda/prefill_*_test's):
//   matmul      CudaBackend::PrefillMatmul (x' prep + GEMM per call) at the
//               model's projections, T = 1..8192: us/call, TFLOP/s and % of
//               the dense bf16 peak (989 TFLOP/s); at T = 1 the weights'
//               read rate (the call is weight-bound there);
//   delta_rule  the gated delta rule at T = 1024 and 8192: the chunked form,
//               the per-token prefill kernel and the exact (decode) kernel,
//               ms/call and us/token;
//   attention   prefill attention at T = 8192 from 0, 512 after 7680 and
//               2048 from 0: ms/call and TFLOP/s (causal); then 31
//               sessions' 64-row suffixes after an 8,128-token prefix (one
//               layer of a PrefillBatch pass): one launch per slice against
//               the slices in one call.
//
// Usage: prefill_ops_bench [matmul] [delta_rule] [attention]  (default: all)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kernels/attention.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_handles.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"
#include "kernels/gated_delta_rule.h"
#include "kernels/matmul.h"
#include "tools/bench_timing/bench_check.h"

namespace specserve::kernels::cuda {
namespace {

#define BENCH_CUDA(expr) BENCH_CHECK(CudaStatus((expr), #expr))

// Milliseconds per call of `fn` (work issued on the backend's stream) over
// `calls` calls back to back, after `warm` untimed ones.
template <typename Fn>
double EventMs(CudaBackend* gpu, int warm, int calls, Fn fn) {
  auto start = CreateEvent(true);
  auto stop = CreateEvent(true);
  BENCH_CHECK(start.status());
  BENCH_CHECK(stop.status());
  for (int i = 0; i < warm; ++i) fn();
  BENCH_CHECK(gpu->Synchronize());
  BENCH_CUDA(cudaEventRecord(start->get(), gpu->stream()));
  for (int i = 0; i < calls; ++i) fn();
  BENCH_CUDA(cudaEventRecord(stop->get(), gpu->stream()));
  BENCH_CUDA(cudaEventSynchronize(stop->get()));
  float ms = 0.0f;
  BENCH_CUDA(cudaEventElapsedTime(&ms, start->get(), stop->get()));
  BENCH_CHECK(gpu->Synchronize());
  return ms / calls;
}

// n floats on the GPU, scale·U(-1, 1) from `seed`.
Buffer RandomFloats(CudaBackend* gpu, int64_t n, uint64_t seed, float scale) {
  auto b = gpu->AllocateFloats(n);
  BENCH_CHECK(b.status());
  BENCH_CHECK(
      LaunchFillRandom(DType::kF32, b->data(), n, seed, scale, gpu->stream()));
  return std::move(*b);
}

// n floats ~ U(lo, hi) made on the host (the small per-head inputs).
Buffer UniformFloats(CudaBackend* gpu, std::mt19937* rng, int64_t n, float lo,
                     float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> host(n);
  for (float& x : host) x = d(*rng);
  auto b = gpu->AllocateFloats(n);
  BENCH_CHECK(b.status());
  BENCH_CHECK(gpu->CopyToDevice(b->data(), host.data(), n * sizeof(float)));
  return std::move(*b);
}

// ------------------------------------------------------------- matmul

// What a projection reads in front of its product.
enum class Fuse { kNone, kNorm, kSwiglu };

void MatmulBench(CudaBackend* gpu) {
  struct Shape {
    const char* name;
    int64_t out, in;
    Fuse fuse;
    bool accumulate;
    std::vector<int64_t> rows;
  };
  const std::vector<Shape> kShapes = {
      {"gate|up", 34816, 5120, Fuse::kNorm, false, {1, 1024, 4096, 8192}},
      {"down", 5120, 17408, Fuse::kSwiglu, true, {1, 1024, 4096, 8192}},
      {"in_proj", 16480, 5120, Fuse::kNorm, false, {1024, 4096, 8192}},
      {"q|k|v", 14336, 5120, Fuse::kNorm, false, {1024, 4096, 8192}},
      {"o_proj", 5120, 6144, Fuse::kNone, true, {1024, 4096, 8192}},
      {"lm_head", 248320, 5120, Fuse::kNorm, false, {1, 256, 1024}},
  };
  constexpr double kPeakTflops = 989.0;
  uint64_t seed = 1;
  std::printf("matmul: PrefillMatmul (x' prep + GEMM) per call\n");
  std::printf("%-8s %6s %6s %6s %10s %9s %6s\n", "shape", "T", "out", "in",
              "us/call", "TFLOP/s", "%peak");
  for (const Shape& sh : kShapes) {
    Weight w;
    w.dtype = DType::kBF16;
    w.rows = sh.out;
    w.cols = sh.in;
    auto ws = gpu->Allocate(w.bytes());
    BENCH_CHECK(ws.status());
    w.storage = std::move(*ws);
    w.data = w.storage.data();
    BENCH_CHECK(LaunchFillRandom(DType::kBF16, w.storage.data(), sh.out * sh.in,
                                 seed++, 1.0f, gpu->stream()));
    BENCH_CHECK(gpu->TileForTensorCores(&w));
    const Buffer norm = RandomFloats(gpu, sh.in, seed++, 0.1f);
    const int64_t max_rows = *std::max_element(sh.rows.begin(), sh.rows.end());
    const int64_t x_stride = sh.fuse == Fuse::kSwiglu ? 2 * sh.in : sh.in;
    const Buffer x = RandomFloats(gpu, max_rows * x_stride, seed++, 1.0f);
    auto y = gpu->AllocateFloats(max_rows * sh.out);
    BENCH_CHECK(y.status());
    BENCH_CHECK(gpu->Zero(y->data(), max_rows * sh.out * sizeof(float)));
    for (int64_t rows : sh.rows) {
      MatmulParams p = DenseMatmul(rows, x.f32(), w, y->f32(), sh.accumulate);
      p.x_stride = x_stride;
      p.swiglu = sh.fuse == Fuse::kSwiglu;
      if (sh.fuse == Fuse::kNorm) p.norm_weight = norm.f32();
      if (!PrefillMatmulApplies(p)) {
        std::fprintf(stderr, "matmul %s: the prefill kernel does not apply\n",
                     sh.name);
        std::exit(1);
      }
      const double us = 1e3 * EventMs(gpu, 2, 10, [&] {
                          BENCH_CHECK(gpu->PrefillMatmul(p));
                        });
      const double tflops = 2.0 * rows * sh.out * sh.in / (us * 1e-6) / 1e12;
      std::printf("%-8s %6lld %6lld %6lld %10.1f %9.1f %5.1f%%", sh.name,
                  static_cast<long long>(rows), static_cast<long long>(sh.out),
                  static_cast<long long>(sh.in), us, tflops,
                  100.0 * tflops / kPeakTflops);
      if (rows == 1) {
        std::printf("  (weights %.0f GB/s)", w.bytes() / (us * 1e-6) / 1e9);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
}

// --------------------------------------------------------- delta rule

void DeltaRuleBench(CudaBackend* gpu) {
  // The 27B shape: nk key heads, nv value heads of dk x dv state each.
  constexpr int nk = 16, nv = 48, dk = 128, dv = 128;
  constexpr int kMaxRows = 8192;
  // Layout of worker/model/blocks.cc (LinearAttentionBlock): a qkv row is
  // [q nk·dk | k nk·dk | v nv·dv]; an a/b row [z nv·dv | b nv | a nv].
  constexpr int64_t qkv_stride = 2 * nk * dk + nv * dv;
  constexpr int64_t ab_stride = nv * dv + 2 * nv;
  constexpr int64_t out_stride = nv * dv;
  std::mt19937 rng(20250301);
  const Buffer qkv = RandomFloats(gpu, kMaxRows * qkv_stride, 1, 1.0f);
  const Buffer ab = RandomFloats(gpu, kMaxRows * ab_stride, 2, 2.0f);
  const Buffer out = RandomFloats(gpu, kMaxRows * out_stride, 3, 1.0f);
  const Buffer a_log = UniformFloats(gpu, &rng, nv, -1.0f, 0.5f);
  const Buffer dt_bias = UniformFloats(gpu, &rng, nv, -0.5f, 0.5f);
  const Buffer state =
      UniformFloats(gpu, &rng, int64_t{nv} * dk * dv, -0.1f, 0.1f);
  std::printf("delta rule: one call over T tokens, in place on the state\n");
  for (int rows : {1024, kMaxRows}) {
    GatedDeltaRuleParams g;
    g.rows = rows;
    g.num_k_heads = nk;
    g.num_v_heads = nv;
    g.k_head_dim = dk;
    g.v_head_dim = dv;
    g.q = qkv.f32();
    g.k = qkv.f32() + nk * dk;
    g.v = qkv.f32() + 2 * nk * dk;
    g.qkv_stride = qkv_stride;
    g.b = ab.f32() + nv * dv;
    g.a = ab.f32() + nv * dv + nv;
    g.ab_stride = ab_stride;
    g.a_log = a_log.f32();
    g.dt_bias = dt_bias.f32();
    g.state_in = state.data();
    g.state_out = state.data();
    g.state_dtype = DType::kF32;
    g.out = out.f32();
    g.out_stride = out_stride;
    g.position = 0;
    const double chunked = EventMs(gpu, 1, 10, [&] {
      BENCH_CHECK(LaunchPrefillChunkedDeltaRule(g, gpu->stream()));
    });
    const double per_token = EventMs(gpu, 1, 5, [&] {
      BENCH_CHECK(LaunchPrefillGatedDeltaRule(g, gpu->stream()));
    });
    const double exact =
        EventMs(gpu, 1, 3, [&] { BENCH_CHECK(gpu->GatedDeltaRule(g)); });
    std::printf(
        "prefill gated delta rule speed: nk=%d nv=%d dk=%d dv=%d T=%d: "
        "chunked %.3f ms/call (%.3f us/token), per-token %.3f ms/call "
        "(%.3f us/token), exact %.3f ms/call (%.3f us/token)\n",
        nk, nv, dk, dv, rows, chunked, chunked * 1e3 / rows, per_token,
        per_token * 1e3 / rows, exact, exact * 1e3 / rows);
    std::fflush(stdout);
  }
}

// ---------------------------------------------------------- attention

void AttentionBench(CudaBackend* gpu) {
  // The 27B shape: nh query heads over nkv KV heads of hd each.
  constexpr int nh = 24, nkv = 4, hd = 256;
  // Layout of worker/model/blocks.cc (FullAttentionBlock): a q row holds,
  // per head, q then its gate, then the keys and values.
  constexpr int64_t q_stride = nh * 2 * hd + 2 * nkv * hd;
  constexpr int64_t kv_stride = nkv * hd;
  constexpr int64_t capacity = 8192;
  const Buffer q = RandomFloats(gpu, capacity * q_stride, 1, 1.0f);
  const Buffer k = RandomFloats(gpu, capacity * kv_stride, 2, 1.0f);
  const Buffer v = RandomFloats(gpu, capacity * kv_stride, 3, 1.0f);
  const Buffer out = RandomFloats(gpu, capacity * nh * hd, 4, 1.0f);
  // Rows [row0, row0 + rows) of q and out, at positions first.. .
  auto params = [&](int rows, int first, int row0) {
    AttentionParams p;
    p.rows = rows;
    p.num_heads = nh;
    p.num_kv_heads = nkv;
    p.head_dim = hd;
    p.q = q.f32() + row0 * q_stride;
    p.q_row_stride = q_stride;
    p.q_head_stride = 2 * hd;
    p.gate = p.q + hd;
    p.gate_row_stride = q_stride;
    p.gate_head_stride = 2 * hd;
    p.k_cache = k.f32();
    p.v_cache = v.f32();
    p.kv_row_stride = kv_stride;
    p.capacity = capacity;
    p.first_position = first;
    p.out = out.f32() + row0 * nh * hd;
    p.out_row_stride = nh * hd;
    p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    return p;
  };
  std::printf("attention: gated, causal, one layer\n");
  for (const auto& [rows, first] :
       {std::pair<int, int>{8192, 0}, std::pair<int, int>{512, 7680},
        std::pair<int, int>{2048, 0}}) {
    const AttentionParams p = params(rows, first, 0);
    const double ms = EventMs(gpu, 1, 10, [&] {
      BENCH_CHECK(LaunchPrefillAttention(p, gpu->stream()));
    });
    double keys = 0.0;  // Σ_t (first + t + 1)
    for (int t = 0; t < rows; ++t) keys += first + t + 1;
    const double flops = 4.0 * hd * nh * keys;
    std::printf(
        "prefill attention speed: nh=%d nkv=%d hd=%d T=%d first=%d: "
        "%.3f ms/call, %.1f TFLOP/s (causal)\n",
        nh, nkv, hd, rows, first, ms, flops / (ms * 1e-3) / 1e12);
    std::fflush(stdout);
  }
  // The slices read one cache here: the same work either way.
  constexpr int kSlices = 31, kRows = 64;
  std::vector<AttentionParams> slices;
  for (int i = 0; i < kSlices; ++i) {
    slices.push_back(
        params(kRows, static_cast<int>(capacity) - kRows, i * kRows));
  }
  const double each = EventMs(gpu, 1, 10, [&] {
    for (const AttentionParams& p : slices) {
      BENCH_CHECK(LaunchPrefillAttention(p, gpu->stream()));
    }
  });
  const double together = EventMs(gpu, 1, 10, [&] {
    BENCH_CHECK(LaunchPrefillAttentionSlices(slices, gpu->stream()));
  });
  std::printf(
      "prefill attention speed: %d slices of %d rows at %lld: one launch each "
      "%.3f ms, one call %.3f ms (%.1fx)\n",
      kSlices, kRows, static_cast<long long>(capacity - kRows), each, together,
      each / together);
}

int Main(int argc, char** argv) {
  const std::set<std::string> kSections = {"matmul", "delta_rule", "attention"};
  std::set<std::string> run;
  for (int i = 1; i < argc; ++i) {
    if (kSections.count(argv[i]) == 0) {
      std::fprintf(stderr,
                   "usage: prefill_ops_bench [matmul] [delta_rule] "
                   "[attention]\n");
      return 2;
    }
    run.insert(argv[i]);
  }
  if (run.empty()) run = kSections;
  if (CudaDeviceCount() == 0) {
    std::printf("prefill_ops_bench: no CUDA device visible, nothing to time\n");
    return 0;
  }
  auto created = CreateCudaBackend(0);
  BENCH_CHECK(created.status());
  auto* gpu = static_cast<CudaBackend*>(created->get());
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  if (run.count("matmul")) MatmulBench(gpu);
  if (run.count("delta_rule")) DeltaRuleBench(gpu);
  if (run.count("attention")) AttentionBench(gpu);
  return 0;
}

}  // namespace
}  // namespace specserve::kernels::cuda

int main(int argc, char** argv) {
  return specserve::kernels::cuda::Main(argc, argv);
}
