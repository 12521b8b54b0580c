// The CUDA backend's benchmark on one GPU, every number beside its floor
// (bytes that must be read / copy bandwidth measured in the same run):
//  1. device-to-device copy bandwidth (the ceiling; read + write bytes);
//  2. matmul [out][in] bf16 at T = 1..64 on the tensor-core path (x split
//     in 3 or 2 bf16 terms) and on the CUDA-core kernel, with bit-exact
//     row-invariance and cross-path agreement checks;
//  3. a random-bf16 model of the Qwen3.5-27B shape built on the GPU
//     (tools/cuda_bench/random_model.h): (a) decode step at batch 1,
//     (b) verify of 2..8 columns, (c) DecodeBatch of 1..64 sessions
//     (each B also beside its state-inclusive floor, and B = 1 and 64
//     again with a bf16 recurrent state), (f) prefill of 64..2048 tokens,
//     (g) with --prefill_only: suffixes after a shared prefix in one
//     PrefillBatch pass; (h) DecodeBatch at 2k / 8k / 32k contexts beside
//     the state-inclusive floor (alone with --long_context_only);
//  4. decode tokens/s of --default_model (a checkpoint dir), if given, and
//     (d) plain vs speculative greedy tokens/s through the engine
//     (SpecEngine bursts, k = 0..4), checking spec == plain token for token.
// Prints tables and writes --json.
//
// Usage: cuda_bench [--json=FILE] [--default_model=DIR] [--skip_model]
//                   [--skip_matmul] [--quick_sweep] [--x_splits=2] [--leave_out]
//                   [--decode_only] [--long_context_only] [--long_context=N]
//                   [--synthetic_dir=/tmp/specserve_27b]
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_handles.h"
#include "kernels/cuda/matmul_mma.h"
#include "kernels/cuda/ops.h"
#include "nlohmann/json.hpp"
#include "tools/bench_timing/bench_timing.h"
#include "tools/cuda_bench/random_model.h"
#include "worker/model/model.h"
#include "worker/spec/model_executor.h"
#include "worker/spec/spec_engine.h"
#include "tools/bench_timing/bench_check.h"

namespace specserve::cuda_bench {
namespace {

using kernels::Backend;
using kernels::cuda::CudaBackend;
using nlohmann::json;
using bench::Median;
using bench::WallMs;

#define BENCH_CUDA(expr) BENCH_CHECK(kernels::cuda::CudaStatus((expr), #expr))

// Median ms of `reps` event-timed calls of fn on `stream` after `warm`.
template <typename Fn>
double EventMs(cudaStream_t stream, int warm, int reps, Fn fn) {
  auto a = kernels::cuda::CreateEvent(true);
  auto b = kernels::cuda::CreateEvent(true);
  BENCH_CHECK(a.status());
  BENCH_CHECK(b.status());
  for (int i = 0; i < warm; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    BENCH_CUDA(cudaEventRecord(a->get(), stream));
    fn();
    BENCH_CUDA(cudaEventRecord(b->get(), stream));
    BENCH_CUDA(cudaEventSynchronize(b->get()));
    float m = 0;
    BENCH_CUDA(cudaEventElapsedTime(&m, a->get(), b->get()));
    ms.push_back(m);
  }
  return Median(ms);
}

std::unique_ptr<Backend> MakeBackend(int splits,
                                     kernels::DType kv_cache = kernels::DType::kBF16,
                                     kernels::DType rec = kernels::DType::kF32) {
  kernels::cuda::CudaBackendOptions o;
  o.matmul_x_splits = splits;
  o.kv_cache_dtype = kv_cache;
  o.recurrent_state_dtype = rec;
  auto b = kernels::cuda::CreateCudaBackend(o);
  BENCH_CHECK(b.status());
  return std::move(*b);
}

// GB/s of a device-to-device copy of `bytes`, counting read + write.
double CopyGBs(CudaBackend* be, size_t bytes) {
  auto src = be->Allocate(bytes);
  auto dst = be->Allocate(bytes);
  BENCH_CHECK(src.status());
  BENCH_CHECK(dst.status());
  const double ms = EventMs(be->stream(), 3, 20, [&] {
    BENCH_CUDA(cudaMemcpyAsync(dst->data(), src->data(), bytes, cudaMemcpyDeviceToDevice,
                               be->stream()));
  });
  return 2.0 * bytes / (ms * 1e6);
}

struct Ctx {
  double copy_gbs = 0;
  int model_splits = 2;  // --x_splits: bf16 terms per x in the models' matmuls
  // --kv_cache_dtype=fp32|bf16: the models' attention KV caches (bf16 is
  // specserve_worker's default on CUDA).
  kernels::DType kv_dtype = kernels::DType::kBF16;
  bool leave_out = false;  // --leave_out: LeaveOutSweep after (a)
  bool decode_only = false;       // --decode_only: the 27B shape's (a) alone
  bool quick_sweep = false;  // --quick_sweep (MatmulSweep)
  bool prefill_only = false;  // --prefill_only: the 27B shape's (f) alone
  bool long_context_only = false;  // --long_context_only: the 27B shape's (h) alone
  int long_context = 0;  // --long_context=N: (h) at N rows only (0: 2k, 8k and 32k)
  // --profile_b=B: (h) wraps B sessions' eager step in cudaProfilerStart/Stop
  // (for `ncu --profile-from-start off`).
  int profile_b = 0;
  json out = json::object();
};

// ---- 2. matmul sweep.
// Median ms per call of `p`, timed as 10 calls between one pair of events: a
// decode step issues its matmuls back to back, so that is what a call costs
// there (an isolated call would add the idle launch latency).
double BackToBackMatmulMs(CudaBackend* be, const kernels::MatmulParams& p) {
  constexpr int kCalls = 10;
  return EventMs(be->stream(), 3, 15, [&] {
           for (int i = 0; i < kCalls; ++i) BENCH_CHECK(be->Matmul(p));
         }) /
         kCalls;
}

void MatmulSweep(Ctx* ctx) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      // The 27B shape's matmuls: down, gate|up, linear in_proj, out_proj and
      // o_proj, q|k|v, lm_head.
      {5120, 17408}, {34816, 5120}, {16480, 5120}, {5120, 6144},
      {14336, 5120}, {248320, 5120}};
  // --quick_sweep: T = 1, 4, 64 on the tensor-core path only.
  const std::vector<int> ts = ctx->quick_sweep ? std::vector<int>{1, 4, 64}
                                               : std::vector<int>{1, 2, 4, 8, 16, 32, 64};
  std::printf("\n== matmul, bf16 weight (floor = weight bytes / copy bandwidth)\n");
  std::printf("%-16s %-10s %4s %9s %9s %8s %8s\n", "[out][in]", "path", "T", "us", "floor_us",
              "%floor", "x T=1");
  json rows = json::array();
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1, 1);
  struct Path {
    const char* name;
    int splits;
  };
  const Path paths[] = {{"mma-x2", 2}, {"fma", 0}};
  for (const Path& path : paths) {
    if (ctx->quick_sweep && path.splits == 0) continue;
    auto owner = MakeBackend(path.splits);
    auto* be = static_cast<CudaBackend*>(owner.get());
    RandomWeightsBackend rb(be, 0.02f);
    for (auto [out, in] : shapes) {
      if (path.splits == 0 && out > 20000) continue;  // slow and not used
      auto w = rb.UploadWeight(kernels::DType::kBF16, nullptr, out, in);
      BENCH_CHECK(w.status());
      std::vector<float> xh(64 * in);
      for (auto& v : xh) v = dist(rng);
      auto x = be->AllocateFloats(xh.size());
      auto y = be->AllocateFloats(64 * out);
      BENCH_CHECK(x.status());
      BENCH_CHECK(y.status());
      BENCH_CHECK(be->CopyToDevice(x->data(), xh.data(), xh.size() * 4));
      const double floor_us = w->bytes() / (ctx->copy_gbs * 1e3);
      double t1 = 0;
      for (int t : ts) {
        const auto p = kernels::DenseMatmul(t, x->f32(), *w, y->f32());
        const double ms = BackToBackMatmulMs(be, p);
        if (t == 1) t1 = ms;
        char shape[32];
        std::snprintf(shape, sizeof(shape), "[%lld][%lld]", (long long)out, (long long)in);
        std::printf("%-16s %-10s %4d %9.1f %9.1f %7.1f%% %8.2f\n", shape, path.name, t, ms * 1e3,
                    floor_us, 100 * floor_us / (ms * 1e3), ms / t1);
        rows.push_back({{"out", out}, {"in", in}, {"path", path.name}, {"T", t},
                        {"us", ms * 1e3}, {"floor_us", floor_us}});
      }
      // Row invariance: T=64 row r == T=1 on row r, bit for bit.
      if (out <= 20000) {
        std::vector<float> all(64 * out), one(out);
        BENCH_CHECK(be->Matmul(kernels::DenseMatmul(64, x->f32(), *w, y->f32())));
        BENCH_CHECK(be->CopyToHost(all.data(), y->data(), all.size() * 4));
        int bad = 0;
        for (int r : {0, 5, 37, 63}) {
          BENCH_CHECK(be->Matmul(kernels::DenseMatmul(1, x->f32() + r * in, *w, y->f32())));
          BENCH_CHECK(be->CopyToHost(one.data(), y->data(), out * 4));
          bad += std::memcmp(one.data(), all.data() + r * out, out * 4) != 0;
        }
        std::printf("  row invariance T=64 vs T=1 (%s): %s\n", path.name,
                    bad ? "MISMATCH" : "bit-exact");
        ctx->out["row_invariance"][path.name] = bad == 0;
        if (bad) ctx->out["failed"] = true;
      }
    }
  }
  ctx->out["matmul"] = rows;
}

// ---- 3. the 27B-shape model.
// Prints a RandomWeightsBackend timeline ({op: (ms, calls)} over `steps`
// steps) per step, largest first, and returns it as JSON.
json PrintTimeline(const char* label,
                   const std::map<std::string, std::pair<double, int>>& t, int steps) {
  std::vector<std::pair<double, std::string>> order;
  double total = 0;
  for (const auto& [name, v] : t) {
    order.push_back({v.first, name});
    total += v.first;
  }
  std::sort(order.rbegin(), order.rend());
  std::printf("    GPU timeline per step, %s (event gaps; %.2f ms in all):\n", label,
              total / steps);
  std::printf("      %-26s %9s %7s %9s\n", "op", "ms", "calls", "us/call");
  json out = json::array();
  for (const auto& [ms, name] : order) {
    const int calls = t.at(name).second;
    std::printf("      %-26s %9.3f %7d %9.1f\n", name.c_str(), ms / steps, calls / steps,
                1e3 * ms / calls);
    out.push_back({{"op", name}, {"ms", ms / steps}, {"calls", calls / steps}});
  }
  return out;
}

// (a) with groups of short ops left out (--leave_out): the greedy step,
// recorded again without them, against the full step: the most that fusing
// each group away could save. The tokens are meaningless meanwhile.
void LeaveOutSweep(RandomWeightsBackend* rb, model::Model* m, model::ModelState* st,
                   int32_t* next, double full_ms, json* j) {
  const std::vector<std::pair<std::string, std::set<std::string>>> groups = {
      {"conv1d", {"conv1d"}},
      {"gated_delta_rule_normed", {"gated_delta_rule_normed"}},  // rule + gated norm
      {"attention_inputs", {"attention_inputs"}},
      {"attention", {"attention"}},
      // (with the final norm; RoPE, the scatters and SwiGLU run inside
      // attention_inputs and the matmuls)
      {"all short ops", {"conv1d", "gated_delta_rule_normed", "rms_norm",
                         "attention_inputs", "attention"}},
  };
  model::ForwardResult lean;
  lean.want_logits = false;
  std::printf("    left out (greedy step recorded again without them; full %.2f ms):\n"
              "      %-28s %9s %9s\n", full_ms, "ops", "ms", "saved_ms");
  json out = json::array();
  for (const auto& [name, ops] : groups) {
    rb->set_skipped(ops);
    m->DropRecordedSteps();
    const double ms = WallMs(3, 20, [&] {
      BENCH_CHECK(m->Decode(st, *next, &lean));
      *next = lean.argmax[0];
    });
    std::printf("      %-28s %9.2f %9.2f\n", name.c_str(), ms, full_ms - ms);
    out.push_back({{"left_out", name}, {"ms", ms}, {"saved_ms", full_ms - ms}});
  }
  rb->set_skipped({});
  m->DropRecordedSteps();
  (*j)["decode_left_out"] = out;
}

// n token ids spread over the vocabulary (the random-weight model's
// prompts: any ids do).
std::vector<int32_t> SyntheticPrompt(int n) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(1 + (i * 7919) % 200000);
  return ids;
}

// (f) prefill of P prompt tokens into an empty state, beside two floors:
// the weight bytes the chunked prefill reads (one pass per
// Model::kMaxPrefillRows rows) over the copy bandwidth, and the tensor-core
// work at the H200's nominal dense bf16 rate (989 TFLOP/s): the prefill
// forms round x to one bf16 term, so 2 FLOP per trunk weight per row, plus
// causal attention's 4·hd FLOP per (query head, query row, visible key).
// Then one 512-token prefill op by op.
void PrefillBench(Ctx* ctx, model::Model* m, RandomWeightsBackend* rb, double floor_ms,
                  json* j) {
  const model::ModelConfig& c = m->config();
  const double lm_head_bytes = 2.0 * c.vocab_size * c.hidden_size;
  const double weight_bytes = static_cast<double>(m->decode_weight_bytes());
  const double trunk_elems = (weight_bytes - lm_head_bytes) / 2.0;
  constexpr double kNominalTflops = 989.0;
  model::StateOptions so;
  constexpr int kLongest = 32768;
  so.capacity = kLongest + 64;
  so.max_verify_columns = 1;
  auto st = m->NewState(so);
  BENCH_CHECK(st.status());
  std::printf("(f) prefill into an empty state (floors: bytes = passes of %d rows x trunk "
              "weights + lm_head once, over the copy bandwidth; tensor = 1-term x matmuls "
              "and causal attention at %.0f TFLOP/s nominal):\n%6s %7s %10s %10s %9s %12s "
              "%12s %8s\n",
              model::Model::kMaxPrefillRows, kNominalTflops, "P", "passes", "ms", "tok/s",
              "TFLOP", "bytes_floor", "tensor_floor", "%tensor");
  json out = json::array();
  model::ForwardResult r;
  const double attn_layers = static_cast<double>(c.num_full_attention_layers());
  for (int P : {64, 512, 2048, 8192, kLongest}) {
    const std::vector<int32_t> prompt = SyntheticPrompt(P);
    std::vector<double> ms;
    for (int rep = 0; rep < 3; ++rep) {
      BENCH_CHECK(m->Reset(st->get()));
      BENCH_CHECK(rb->Synchronize());
      const auto t0 = std::chrono::steady_clock::now();
      BENCH_CHECK(m->Prefill(st->get(), prompt, {}, &r));
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
              .count());
    }
    const int passes =
        (P + model::Model::kMaxPrefillRows - 1) / model::Model::kMaxPrefillRows;
    const double bytes_ms =
        floor_ms * (passes * (weight_bytes - lm_head_bytes) + lm_head_bytes) / weight_bytes;
    // Σ_t (t + 1) visible keys per query row.
    const double visible = 0.5 * static_cast<double>(P) * (P + 1);
    const double flop = 2.0 * trunk_elems * P +
                        4.0 * c.head_dim * c.num_attention_heads * visible * attn_layers;
    const double tensor_ms = flop / (kNominalTflops * 1e9);
    const double med = Median(ms);
    std::printf("%6d %7d %10.1f %10.0f %9.1f %12.1f %12.1f %7.1f%%\n", P, passes, med,
                P * 1e3 / med, flop / 1e12, bytes_ms, tensor_ms, 100.0 * tensor_ms / med);
    out.push_back({{"P", P}, {"passes", passes}, {"ms", med}, {"tok_s", P * 1e3 / med},
                   {"tflop", flop / 1e12}, {"bytes_floor_ms", bytes_ms},
                   {"tensor_floor_ms", tensor_ms}, {"pct_of_tensor_floor", 100.0 * tensor_ms / med}});
  }
  (*j)["prefill"] = out;
  const std::vector<int32_t> prompt = SyntheticPrompt(512);
  BENCH_CHECK(m->Reset(st->get()));
  m->set_use_graphs(false);
  rb->StartTimeline();
  BENCH_CHECK(m->Prefill(st->get(), prompt, {}, &r));
  (*j)["prefill512_timeline"] = PrintTimeline("(f) prefill of 512", rb->StopTimeline(), 1);
  m->set_use_graphs(true);
}

// (g) the suffixes of B requests that share one C-token prefix, R rows each,
// prefilled in one PrefillBatch pass (B slices), against the same B·R rows as
// one slice of one session after the prefix: what running the cache ops per
// slice costs over the shared matmuls. Then the B-slice pass op by op. The
// B states are copies of the prefix's state (ForkState; no page sharing:
// the pass reads the same bytes either way).
void SharedPrefixSuffixBench(model::Model* m, RandomWeightsBackend* rb, json* j) {
  constexpr int kPrefix = 8192, kSlices = 31, kRows = 64;
  model::StateOptions so;
  so.capacity = kPrefix + kSlices * kRows + 64;
  so.max_verify_columns = 1;
  auto prefix = m->NewState(so);
  BENCH_CHECK(prefix.status());
  model::ForwardResult r;
  BENCH_CHECK(m->Prefill(prefix->get(), SyntheticPrompt(kPrefix), {}, &r));
  std::vector<std::unique_ptr<model::ModelState>> owned;
  std::vector<model::ModelState*> states;
  for (int i = 0; i < kSlices; ++i) {
    auto st = m->NewState(so);
    BENCH_CHECK(st.status());
    states.push_back(st->get());
    owned.push_back(std::move(*st));
  }
  std::vector<std::vector<int32_t>> suffixes;
  std::vector<absl::Span<const int32_t>> spans;
  for (int i = 0; i < kSlices; ++i) {
    std::vector<int32_t> ids = SyntheticPrompt(kRows);
    for (int32_t& id : ids) id = 1 + (id + 1000 * (i + 1)) % 200000;
    suffixes.push_back(std::move(ids));
  }
  for (const auto& ids : suffixes) spans.push_back(ids);
  std::vector<model::ForwardResult> results(kSlices);
  std::vector<model::ForwardResult*> outs;
  for (auto& x : results) outs.push_back(&x);
  auto fork_all = [&] {
    for (model::ModelState* st : states) {
      BENCH_CHECK(m->Reset(st));
      BENCH_CHECK(m->ForkState(**prefix, nullptr, st));
    }
    BENCH_CHECK(rb->Synchronize());
  };
  auto timed = [&](const std::function<void()>& run) {
    std::vector<double> ms;
    for (int rep = 0; rep < 3; ++rep) {
      fork_all();
      const auto t0 = std::chrono::steady_clock::now();
      run();
      BENCH_CHECK(rb->Synchronize());
      ms.push_back(std::chrono::duration<double, std::milli>(
                       std::chrono::steady_clock::now() - t0)
                       .count());
    }
    return Median(ms);
  };
  const double batch_ms = timed([&] {
    BENCH_CHECK(m->PrefillBatch(states, spans, {}, outs));
  });
  std::vector<int32_t> flat;
  for (const auto& ids : suffixes) flat.insert(flat.end(), ids.begin(), ids.end());
  const double one_ms = timed([&] { BENCH_CHECK(m->Prefill(states[0], flat, {}, &r)); });
  std::printf("(g) %d suffixes of %d rows after a %d-token prefix, one PrefillBatch pass: "
              "%.1f ms; the same %d rows as one slice: %.1f ms (%.2fx)\n",
              kSlices, kRows, kPrefix, batch_ms, kSlices * kRows, one_ms, batch_ms / one_ms);
  (*j)["shared_prefix_suffixes"] = {{"prefix", kPrefix},      {"slices", kSlices},
                                    {"rows", kRows},          {"batch_ms", batch_ms},
                                    {"one_slice_ms", one_ms}, {"ratio", batch_ms / one_ms}};
  fork_all();
  m->set_use_graphs(false);
  rb->StartTimeline();
  BENCH_CHECK(m->PrefillBatch(states, spans, {}, outs));
  (*j)["shared_prefix_suffixes_timeline"] =
      PrintTimeline("(g) 31 suffixes of 64 after 8192", rb->StopTimeline(), 1);
  m->set_use_graphs(true);
}

// One session's bytes per DecodeBatch step besides the weights: every
// linear layer's recurrent state read and written (its element type, the
// model's recurrent_state_dtype) and its fp32 conv state read and written;
// every full-attention layer's K and V rows 0..pos read (kv_rows of them)
// and row pos written. DecodeBatch runs no MTP head.
double SessionStepBytes(const model::Model& m, double kv_rows) {
  const model::ModelConfig& c = m.config();
  const double full = c.num_full_attention_layers();
  const double linear = c.num_hidden_layers - full;
  const double conv =
      double(c.conv_dim()) * (c.linear_conv_kernel_dim - 1) * sizeof(float);
  return linear * 2 * (m.recurrent_state_bytes() + conv) +
         full * 2 * (kv_rows + 1) * m.kv_row_bytes();
}

// KV rows the median timed call of WallMs(warm, reps) reads at B sessions
// of `length` committed rows (each call appends one): the state-inclusive
// floor's context.
double MedianCallKvRows(int length, int warm, int reps) {
  return length + warm + reps / 2 + 1;
}

// The state-inclusive floor of a B-session step: the weights once plus B
// sessions' state traffic, over the copy bandwidth.
double StateFloorMs(const Ctx& ctx, const model::Model& m, int b, double kv_rows) {
  return (static_cast<double>(m.decode_weight_bytes()) + b * SessionStepBytes(m, kv_rows)) /
         (ctx.copy_gbs * 1e6);
}

// (c) again on a second model whose recurrent states are bf16: B = 1 and 64
// sessions of the same prompt, the graphed step and the greedy one, each
// beside its state-inclusive floor, and beside the fp32 run's (`fp32`: the
// sweep's entries, by B). The fp32 model is gone by now (two 27B models do
// not fit beside each other's states).
void Bf16StateBatch(Ctx* ctx, const std::string& dir, const std::map<int, json>& fp32,
                    json* j) {
  auto owner = MakeBackend(ctx->model_splits, ctx->kv_dtype, kernels::DType::kBF16);
  RandomWeightsBackend rb(static_cast<CudaBackend*>(owner.get()), 0.02f);
  auto loaded = model::Model::Load(dir, &rb);
  BENCH_CHECK(loaded.status());
  BENCH_CHECK(rb.Synchronize());
  auto& m = *loaded;
  std::printf("(c) bf16 recurrent state (%.1f MB per session-layer vs %.1f fp32): B, then fp32 "
              "and bf16 side by side (st_floor = weights + B x state traffic, over the copy "
              "bandwidth):\n%6s %9s %9s %9s %9s %9s %9s %10s %10s\n",
              m->recurrent_state_bytes() / 1e6, 2 * m->recurrent_state_bytes() / 1e6, "B",
              "fp32_ms", "bf16_ms", "fp32_flr", "bf16_flr", "x_flr32", "x_flr16", "fp32_grdy",
              "bf16_grdy");
  model::StateOptions so;
  so.capacity = 128;
  so.max_verify_columns = 1;
  const std::vector<int32_t> prompt = SyntheticPrompt(32);
  model::ForwardResult r, lean;
  lean.want_logits = false;
  std::vector<std::unique_ptr<model::ModelState>> states;
  json out = json::array();
  for (int b : {1, 64}) {
    while (static_cast<int>(states.size()) < b) {
      auto s = m->NewState(so);
      BENCH_CHECK(s.status());
      BENCH_CHECK(m->Prefill(s->get(), prompt, {}, &r));
      states.push_back(std::move(*s));
    }
    for (auto& s : states) {
      BENCH_CHECK(m->Reset(s.get()));
      BENCH_CHECK(m->Prefill(s.get(), prompt, {}, &r));
    }
    std::vector<model::ModelState*> ptrs;
    std::vector<int32_t> toks(b, r.argmax[0]);
    for (int i = 0; i < b; ++i) ptrs.push_back(states[i].get());
    const double kv_rows = MedianCallKvRows(states[0]->length(), 3, 10);
    const double ms = WallMs(3, 10, [&] { BENCH_CHECK(m->DecodeBatch(ptrs, toks, &r)); });
    const double ms_lean =
        WallMs(2, 10, [&] { BENCH_CHECK(m->DecodeBatch(ptrs, toks, &lean)); });
    const double floor16 = StateFloorMs(*ctx, *m, b, kv_rows);
    const json& f = fp32.at(b);
    const double ms32 = f["ms"], floor32 = f["state_floor_ms"], lean32 = f["greedy_ms"];
    std::printf("%6d %9.2f %9.2f %9.2f %9.2f %9.3f %9.3f %10.2f %10.2f\n", b, ms32, ms, floor32,
                floor16, ms32 / floor32, ms / floor16, lean32, ms_lean);
    out.push_back({{"B", b}, {"ms", ms}, {"greedy_ms", ms_lean}, {"state_floor_ms", floor16},
                   {"x_state_floor", ms / floor16}, {"fp32_ms", ms32},
                   {"fp32_state_floor_ms", floor32}, {"fp32_greedy_ms", lean32}});
  }
  (*j)["decode_batch_bf16_state"] = out;
}

// (h) DecodeBatch of B sessions at long contexts (2k, 8k, 32k committed
// rows), beside the state-inclusive floor at that context (weights + B x
// (state traffic + the KV rows read)), with the op timeline of the B = 1 and
// B = 16 steps at 8k: where the context-dependent time goes.
void LongContextBench(Ctx* ctx, model::Model* m, RandomWeightsBackend* rb, json* j) {
  std::printf("(h) DecodeBatch at long contexts (greedy, the step's CUDA graph; st_floor = "
              "(weight bytes + B x (state traffic + KV rows read)) / copy bandwidth):\n"
              "%8s %4s %9s %9s %9s %12s\n",
              "context", "B", "ms", "st_floor", "x_st", "attn_ms/step");
  model::ForwardResult r, lean;
  lean.want_logits = false;
  json out = json::array();
  const std::vector<std::pair<int, std::vector<int>>> plan = {
      {2048, {1, 16}}, {8192, {1, 16}}, {32768, {1, 4}}};
  for (const auto& [context, sizes] : plan) {
    if (ctx->long_context != 0 && context != ctx->long_context) continue;
    model::StateOptions so;
    so.capacity = context + 64;
    so.max_verify_columns = 1;
    so.draft_state = false;
    const std::vector<int32_t> prompt = SyntheticPrompt(context);
    std::vector<std::unique_ptr<model::ModelState>> states;
    int32_t next = 0;
    for (size_t si = 0; si < sizes.size(); ++si) {
      const int b = sizes[si];
      while (static_cast<int>(states.size()) < b) {
        auto s = m->NewState(so);
        BENCH_CHECK(s.status());
        BENCH_CHECK(m->Prefill(s->get(), prompt, {}, &r));
        next = r.argmax[0];
        states.push_back(std::move(*s));
      }
      std::vector<model::ModelState*> ptrs;
      std::vector<int32_t> toks(b, next);
      for (int i = 0; i < b; ++i) ptrs.push_back(states[i].get());
      const double kv_rows = MedianCallKvRows(states[0]->length(), 3, 10);
      const double st_floor = StateFloorMs(*ctx, *m, b, kv_rows);
      const double ms = WallMs(3, 10, [&] { BENCH_CHECK(m->DecodeBatch(ptrs, toks, &lean)); });
      m->set_use_graphs(false);
      rb->StartTimeline();
      if (b == ctx->profile_b) BENCH_CUDA(cudaProfilerStart());
      BENCH_CHECK(m->DecodeBatch(ptrs, toks, &lean));
      if (b == ctx->profile_b) BENCH_CUDA(cudaProfilerStop());
      const auto timeline = rb->StopTimeline();
      m->set_use_graphs(true);
      double attn_ms = 0;
      for (const auto& [name, v] : timeline) {
        if (name == "attention") attn_ms = v.first;
      }
      std::printf("%8d %4d %9.2f %9.2f %9.3f %12.2f\n", context, b, ms, st_floor, ms / st_floor,
                  attn_ms);
      json row = {{"context", context}, {"B", b},          {"ms", ms},
                  {"state_floor_ms", st_floor}, {"x_state_floor", ms / st_floor},
                  {"attention_ms", attn_ms}};
      if (context == 8192) {
        const std::string label = "(h) 8k context, B=" + std::to_string(b);
        row["timeline"] = PrintTimeline(label.c_str(), timeline, 1);
      }
      out.push_back(row);
      if (si + 1 == sizes.size()) break;
      // Back to the prompt's end for the next size.
      for (auto& s : states) {
        BENCH_CHECK(m->Reset(s.get()));
        BENCH_CHECK(m->Prefill(s.get(), prompt, {}, &r));
      }
    }
  }
  (*j)["decode_long_context"] = out;
}

void ModelBench(Ctx* ctx, const std::string& dir) {
  BENCH_CHECK(WriteSyntheticCheckpoint(Qwen35_27BConfigJson(), dir));
  auto owner = MakeBackend(ctx->model_splits, ctx->kv_dtype);
  auto* be = static_cast<CudaBackend*>(owner.get());
  RandomWeightsBackend rb(be, 0.02f);
  const auto t0 = std::chrono::steady_clock::now();
  auto loaded = model::Model::Load(dir, &rb);
  BENCH_CHECK(loaded.status());
  BENCH_CHECK(rb.Synchronize());
  auto& m = *loaded;
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double wbytes = static_cast<double>(m->decode_weight_bytes());
  const double floor_ms = wbytes / (ctx->copy_gbs * 1e6);
  std::printf("\n== Qwen3.5-27B shape, random bf16 weights made on the GPU (%.1f GB filled, "
              "load %.1f s); matmul x in %d bf16 terms\n",
              rb.filled_bytes() / 1e9, load_s, ctx->model_splits);
  std::printf("decode weight bytes %.2f GB; floor %.2f ms at %.0f GB/s copy\n", wbytes / 1e9,
              floor_ms, ctx->copy_gbs);
  json j = {{"decode_weight_bytes", wbytes}, {"floor_ms", floor_ms}};
  if (ctx->long_context_only) {
    LongContextBench(ctx, m.get(), &rb, &j);
    ctx->out["model_27b"] = j;
    return;
  }
  if (ctx->prefill_only) {
    PrefillBench(ctx, m.get(), &rb, floor_ms, &j);
    SharedPrefixSuffixBench(m.get(), &rb, &j);
    ctx->out["model_27b"] = j;
    return;
  }

  model::StateOptions so;
  so.capacity = 1024;
  so.max_verify_columns = 8;
  auto st = m->NewState(so);
  BENCH_CHECK(st.status());
  const std::vector<int32_t> prompt = SyntheticPrompt(32);
  model::ForwardResult r;
  BENCH_CHECK(m->Prefill(st->get(), prompt, {}, &r));
  bool finite = true;
  for (float v : r.logits) finite &= std::isfinite(v);
  std::printf("prefill logits finite: %s\n", finite ? "yes" : "NO");
  j["logits_finite"] = finite;
  int32_t next = r.argmax[0];
  // (a) decode.
  const double dec = WallMs(3, 20, [&] {
    BENCH_CHECK(m->Decode(st->get(), next, &r));
    next = r.argmax[0];
  });
  std::printf("(a) decode step batch 1: %.2f ms = %.1f tok/s; floor %.2f ms; %.1f%% of floor\n",
              dec, 1e3 / dec, floor_ms, 100 * floor_ms / dec);
  j["decode_ms"] = dec;
  // The step as greedy decoding runs it: argmax, hidden and finiteness
  // flags come back, the [V] logits row stays on the device.
  model::ForwardResult lean;
  lean.want_logits = false;
  const double dec_lean = WallMs(3, 20, [&] {
    BENCH_CHECK(m->Decode(st->get(), next, &lean));
    next = lean.argmax[0];
  });
  std::printf("    greedy (no logits copy): %.2f ms = %.1f tok/s; %.1f%% of floor\n", dec_lean,
              1e3 / dec_lean, 100 * floor_ms / dec_lean);
  j["decode_greedy_ms"] = dec_lean;
  // The same step op by op (no CUDA graph): the anatomy and timeline below
  // are of this path (events cannot time the inside of a replay).
  m->set_use_graphs(false);
  const double dec_eager = WallMs(3, 20, [&] {
    BENCH_CHECK(m->Decode(st->get(), next, &r));
    next = r.argmax[0];
  });
  std::printf("    op by op (no graph): %.2f ms; the graph saves %.2f ms per step\n", dec_eager,
              dec_eager - dec);
  j["decode_eager_ms"] = dec_eager;
  {
    // Where the step's time goes on the host: the backend calls it enqueues
    // and how long the host takes to enqueue them (to its first sync copy).
    std::vector<double> enq, tot;
    int ops = 0, copies = 0;
    for (int i = 0; i < 10; ++i) {
      rb.MarkStep();
      const auto t0 = std::chrono::steady_clock::now();
      BENCH_CHECK(m->Decode(st->get(), next, &r));
      const auto t1 = std::chrono::steady_clock::now();
      next = r.argmax[0];
      enq.push_back(std::chrono::duration<double, std::milli>(rb.first_host_copy() - t0).count());
      tot.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      ops = rb.ops();
      copies = rb.host_copies();
    }
    std::printf("    step anatomy: %d backend calls enqueued, %d synchronous host copies; host "
                "enqueue %.2f ms of the %.2f ms step (%.1f us per call)\n",
                ops, copies, Median(enq), Median(tot), 1e3 * Median(enq) / ops);
    j["decode_ops"] = ops;
    j["decode_host_copies"] = copies;
    j["decode_enqueue_ms"] = Median(enq);
    rb.StartTimeline();
    for (int i = 0; i < 3; ++i) {
      BENCH_CHECK(m->Decode(st->get(), next, &r));
      next = r.argmax[0];
    }
    j["decode_timeline"] = PrintTimeline("(a) decode", rb.StopTimeline(), 3);
  }
  m->set_use_graphs(true);
  if (ctx->leave_out) LeaveOutSweep(&rb, m.get(), st->get(), &next, dec_lean, &j);
  if (ctx->decode_only) {
    ctx->out["model_27b"] = j;
    return;
  }
  // (b) verify.
  // Greedy rounds (the engine's) take no logits; each column is set against
  // the decode step of the same kind.
  std::printf("(b) verify of k+1 columns (state unchanged); greedy = no logits copy, against "
              "the greedy decode step:\n%6s %9s %9s %11s %11s\n", "cols", "ms", "x decode",
              "greedy_ms", "x greedy");
  json jv = json::array();
  for (int c = 2; c <= 8; ++c) {
    std::vector<int32_t> cols(c, next);
    const double ms = WallMs(2, 10, [&] {
      BENCH_CHECK(m->Verify(st->get(), cols, &r));
      m->DiscardVerified(st->get());
    });
    const double ms_lean = WallMs(2, 10, [&] {
      BENCH_CHECK(m->Verify(st->get(), cols, &lean));
      m->DiscardVerified(st->get());
    });
    std::printf("%6d %9.2f %9.3f %11.2f %11.3f\n", c, ms, ms / dec, ms_lean, ms_lean / dec_lean);
    jv.push_back({{"columns", c}, {"ms", ms}, {"x_decode", ms / dec}, {"greedy_ms", ms_lean},
                  {"x_greedy_decode", ms_lean / dec_lean}});
  }
  j["verify"] = jv;
  {
    // Verify of 4 columns op by op: where its time goes beside (a)'s.
    m->set_use_graphs(false);
    std::vector<int32_t> cols(4, next);
    rb.StartTimeline();
    for (int i = 0; i < 3; ++i) {
      BENCH_CHECK(m->Verify(st->get(), cols, &lean));
      m->DiscardVerified(st->get());
    }
    j["verify4_timeline"] = PrintTimeline("(b) verify of 4 columns", rb.StopTimeline(), 3);
    m->set_use_graphs(true);
  }
  st->reset();
  // (c) DecodeBatch of B sessions, 32-token contexts.
  std::printf("(c) DecodeBatch, B sessions at 32-token contexts (ms with the step's CUDA "
              "graph; eager_ms op by op; calls = backend calls enqueued per step op by op, "
              "enq_ms = host time to enqueue them; greedy_ms without the logits copy, as the "
              "engine's greedy batched decode runs; st_floor = (weight bytes + B x one "
              "session's state traffic: recurrent state read + written, conv state, KV rows "
              "read at the median call's context) / copy bandwidth, x_st = ms / st_floor):\n"
              "%6s %9s %9s %11s %9s %9s %9s %9s %7s %9s %10s %9s\n",
              "B", "ms", "x B=1", "tok/s", "%floor", "st_floor", "x_st", "eager_ms", "calls",
              "enq_ms", "greedy_ms", "x B=1");
  std::map<int, json> by_b;  // the sweep's entries, for the bf16-state rerun
  json jb = json::array();
  std::vector<std::unique_ptr<model::ModelState>> states;
  so.capacity = 128;
  so.max_verify_columns = 1;
  double b1 = 0, b1_lean = 0;
  for (int b : {1, 2, 4, 8, 16, 32, 64}) {
    while (static_cast<int>(states.size()) < b) {
      auto s = m->NewState(so);
      BENCH_CHECK(s.status());
      BENCH_CHECK(m->Prefill(s->get(), prompt, {}, &r));
      states.push_back(std::move(*s));
    }
    std::vector<model::ModelState*> ptrs;
    std::vector<int32_t> toks;
    for (int i = 0; i < b; ++i) {
      ptrs.push_back(states[i].get());
      toks.push_back(next);
    }
    // Each call appends a row; contexts grow from 32 to at most 32 + 13.
    const double kv_rows = MedianCallKvRows(states[0]->length(), 3, 10);
    const double st_floor = StateFloorMs(*ctx, *m, b, kv_rows);
    const double ms = WallMs(3, 10, [&] { BENCH_CHECK(m->DecodeBatch(ptrs, toks, &r)); });
    const double ms_lean =
        WallMs(2, 10, [&] { BENCH_CHECK(m->DecodeBatch(ptrs, toks, &lean)); });
    m->set_use_graphs(false);
    const double eager_ms =
        WallMs(1, 5, [&] { BENCH_CHECK(m->DecodeBatch(ptrs, toks, &r)); });
    rb.MarkStep();
    const auto e0 = std::chrono::steady_clock::now();
    BENCH_CHECK(m->DecodeBatch(ptrs, toks, &r));
    const double enq_ms =
        std::chrono::duration<double, std::milli>(rb.first_host_copy() - e0).count();
    const int ops = rb.ops();
    if (b == 1) {
      b1 = ms;
      b1_lean = ms_lean;
    }
    std::printf("%6d %9.2f %9.3f %11.1f %8.1f%% %9.2f %9.3f %9.2f %7d %9.2f %10.2f %9.3f\n", b,
                ms, ms / b1, b * 1e3 / ms, 100 * floor_ms / ms, st_floor, ms / st_floor,
                eager_ms, ops, enq_ms, ms_lean, ms_lean / b1_lean);
    jb.push_back({{"B", b}, {"ms", ms}, {"x_b1", ms / b1}, {"tok_s", b * 1e3 / ms},
                  {"state_floor_ms", st_floor}, {"x_state_floor", ms / st_floor},
                  {"eager_ms", eager_ms}, {"ops", ops}, {"enqueue_ms", enq_ms},
                  {"greedy_ms", ms_lean}, {"greedy_x_b1", ms_lean / b1_lean}});
    by_b[b] = jb.back();
    if (b == 64) {
      rb.StartTimeline();
      BENCH_CHECK(m->DecodeBatch(ptrs, toks, &r));
      j["decode_batch64_timeline"] = PrintTimeline("(c) B=64", rb.StopTimeline(), 1);
    }
    m->set_use_graphs(true);
    // Reset the contexts for the next size.
    for (auto& s : states) {
      BENCH_CHECK(m->Reset(s.get()));
      BENCH_CHECK(m->Prefill(s.get(), prompt, {}, &r));
    }
  }
  j["decode_batch"] = jb;
  PrefillBench(ctx, m.get(), &rb, floor_ms, &j);
  LongContextBench(ctx, m.get(), &rb, &j);
  // The fp32 model's memory goes back before the bf16-state model loads.
  states.clear();
  st->reset();
  loaded->reset();
  Bf16StateBatch(ctx, dir, by_b, &j);
  ctx->out["model_27b"] = j;
}

// ---- 4. the default model.
void DefaultModel(Ctx* ctx, const std::string& dir) {
  auto owner = MakeBackend(ctx->model_splits, ctx->kv_dtype);
  auto loaded = model::Model::Load(dir, owner.get());
  BENCH_CHECK(loaded.status());
  auto& m = *loaded;
  auto st = m->NewState({});
  BENCH_CHECK(st.status());
  model::ForwardResult r;
  const std::vector<int32_t> prompt = {1, 324, 313, 2765, 5811, 7, 2365, 11, 1871, 323};
  BENCH_CHECK(m->Prefill(st->get(), prompt, {}, &r));
  int32_t next = r.argmax[0];
  const double ms = WallMs(5, 100, [&] {
    BENCH_CHECK(m->Decode(st->get(), next, &r));
    next = r.argmax[0];
  });
  m->set_use_graphs(false);
  const double eager_ms = WallMs(5, 100, [&] {
    BENCH_CHECK(m->Decode(st->get(), next, &r));
    next = r.argmax[0];
  });
  const double floor_ms = m->decode_weight_bytes() / (ctx->copy_gbs * 1e6);
  std::printf("\n== %s: decode %.3f ms/token = %.0f tok/s with the step's CUDA graph, %.3f ms "
              "op by op (%.2fx); weight floor %.4f ms\n",
              dir.c_str(), ms, 1e3 / ms, eager_ms, eager_ms / ms, floor_ms);
  ctx->out["default_model"] = {
      {"decode_ms", ms}, {"decode_eager_ms", eager_ms}, {"floor_ms", floor_ms}};
}

// (d) plain (k = 0) vs speculative (k = 1..4) greedy bursts through the
// engine on `dir`: tokens/s, acceptance, and spec == plain token for token.
void EngineBench(Ctx* ctx, const std::string& dir) {
  auto owner = MakeBackend(ctx->model_splits, ctx->kv_dtype);
  auto loaded = model::Model::Load(dir, owner.get());
  BENCH_CHECK(loaded.status());
  auto& m = *loaded;
  if (!m->has_mtp()) return;
  spec::ModelExecutor executor(m.get());
  spec::SpecEngine engine(&executor);
  const std::vector<int32_t> prompt = {1,    324, 313, 2765, 5811, 7,   2365, 11,
                                       1871, 323, 258, 744,  269,  1479, 1};
  constexpr int kNew = 256;
  const double floor_ms = m->decode_weight_bytes() / (ctx->copy_gbs * 1e6);
  std::printf("\n(d) engine bursts on %s: %d greedy tokens after a %zu-token prompt "
              "(weight floor %.4f ms/token = %.0f tok/s)\n%4s %10s %9s %10s %8s %6s\n",
              dir.c_str(), kNew, prompt.size(), floor_ms, 1e3 / floor_ms, "k", "tok/s",
              "ms/tok", "x plain", "accept", "same");
  json jd = json::array();
  std::vector<int32_t> plain_tokens;
  double plain_rate = 0;
  bool all_same = true;
  for (int k = 0; k <= 4; ++k) {
    std::vector<double> secs;
    std::vector<int32_t> tokens;
    double accept = 0;
    for (int rep = 0; rep < 4; ++rep) {
      auto s = engine.Admit("bench", 1024, prompt);
      BENCH_CHECK(s.status());
      spec::BurstParams p;
      p.k = k;
      p.max_new = kNew;
      std::vector<int32_t> got;
      const auto t0 = std::chrono::steady_clock::now();
      auto r = engine.RunBurst(s->get(), p, [&](absl::Span<const int32_t> t) {
        got.insert(got.end(), t.begin(), t.end());
        return true;
      });
      BENCH_CHECK(r.status());
      const double sec =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (rep > 0) secs.push_back(sec / r->produced);  // rep 0 warms up
      got.resize(kNew);
      tokens = got;
      const auto& t = r->telemetry_delta;
      accept = t.drafted ? static_cast<double>(t.accepted) / t.drafted : 0;
    }
    const double ms = 1e3 * Median(secs);
    if (k == 0) {
      plain_tokens = tokens;
      plain_rate = 1e3 / ms;
    }
    const bool same = tokens == plain_tokens;
    all_same &= same;
    std::printf("%4d %10.0f %9.3f %10.2f %8.2f %6s\n", k, 1e3 / ms, ms, (1e3 / ms) / plain_rate,
                accept, same ? "yes" : "NO");
    jd.push_back({{"k", k}, {"tok_s", 1e3 / ms}, {"ms_per_token", ms},
                  {"x_plain", (1e3 / ms) / plain_rate}, {"acceptance", accept},
                  {"same_tokens_as_plain", same}});
  }
  std::string ids;
  for (int32_t t : plain_tokens) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  std::printf("engine plain ids: %s\n", ids.c_str());
  if (!all_same) ctx->out["failed"] = true;
  ctx->out["engine_default_model"] = {{"rows", jd}, {"floor_ms", floor_ms},
                                      {"new_tokens", kNew}, {"spec_equals_plain", all_same}};
}

int Main(int argc, char** argv) {
  std::string json_path = "cuda_bench.json", default_model, synth = "/tmp/specserve_27b";
  Ctx ctx;
  bool decode_only = false;
  bool skip_model = false, skip_matmul = false, ctx_leave_out = false, ctx_quick = false;
  // bf16 terms per activation in the models' matmuls: 2 is the worker's
  // default (CudaBackendOptions), 3 the exact split.
  int model_splits = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--json=", 0) == 0) json_path = a.substr(7);
    if (a.rfind("--default_model=", 0) == 0) default_model = a.substr(16);
    if (a.rfind("--synthetic_dir=", 0) == 0) synth = a.substr(16);
    if (a == "--skip_model") skip_model = true;
    if (a == "--skip_matmul") skip_matmul = true;
    if (a == "--leave_out") ctx_leave_out = true;
    if (a == "--quick_sweep") ctx_quick = true;
    if (a == "--decode_only") decode_only = true;
    if (a == "--prefill_only") ctx.prefill_only = true;
    if (a == "--long_context_only") ctx.long_context_only = true;
    if (a.rfind("--long_context=", 0) == 0) ctx.long_context = std::stoi(a.substr(15));
    if (a.rfind("--profile_b=", 0) == 0) ctx.profile_b = std::stoi(a.substr(12));
    if (a.rfind("--x_splits=", 0) == 0) model_splits = std::stoi(a.substr(11));
    if (a.rfind("--kv_cache_dtype=", 0) == 0) {
      const auto kv = kernels::ParseCacheDTypeFlag("kv_cache_dtype", a.substr(17));
      if (!kv.ok() || !kv->has_value()) {
        std::fprintf(stderr, "cuda_bench: --kv_cache_dtype is fp32 or bf16, got %s\n",
                     a.c_str() + 17);
        return 2;
      }
      ctx.kv_dtype = **kv;
    }
  }
  if (kernels::cuda::CudaDeviceCount() == 0) {
    std::printf("cuda_bench: no CUDA device visible\n");
    return 0;
  }
  ctx.model_splits = model_splits;
  ctx.leave_out = ctx_leave_out;
  ctx.decode_only = decode_only;
  ctx.quick_sweep = ctx_quick;
  ctx.out["model_x_splits"] = model_splits;
  ctx.out["kv_cache_dtype"] = kernels::DTypeName(ctx.kv_dtype);
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  {
    auto owner = MakeBackend(3);
    ctx.copy_gbs = CopyGBs(static_cast<CudaBackend*>(owner.get()), size_t{2} << 30);
  }
  std::printf("device %s, %d SMs, L2 %d MB; D2D copy 2 GiB: %.0f GB/s (read+write)\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, ctx.copy_gbs);
  ctx.out["device"] = prop.name;
  ctx.out["copy_gbs"] = ctx.copy_gbs;
  if (!skip_matmul) MatmulSweep(&ctx);
  if (!default_model.empty()) {
    DefaultModel(&ctx, default_model);
    EngineBench(&ctx, default_model);
  }
  if (!skip_model) ModelBench(&ctx, synth);
  std::ofstream(json_path) << ctx.out.dump(1) << "\n";
  std::printf("\nwrote %s\n", json_path.c_str());
  return ctx.out.value("failed", false) ? 1 : 0;
}

}  // namespace
}  // namespace specserve::cuda_bench

int main(int argc, char** argv) { return specserve::cuda_bench::Main(argc, argv); }
