// Micro-benchmark: the CUDA backend's Matmul on a bf16 5120x17408 weight
// (both orientations: out=5120/in=17408 like down_proj, and out=17408/
// in=5120 like gate/up_proj) at T = 1, 2, 4, 8, 16, 64, against the
// device-to-device copy bandwidth measured in the same run. Prints a table;
// GEMV "weight GB/s" counts the weight bytes read once per call, copy GB/s
// counts bytes read plus bytes written (what a copy moves).
//
// Usage: matmul_bench [--iters=N]   (default 50)
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_handles.h"
#include "tools/bench_timing/bench_check.h"

namespace specserve::kernels::cuda {
namespace {

#define BENCH_CUDA(expr) BENCH_CHECK(CudaStatus((expr), #expr))

// Milliseconds per call of `fn` (issued on `stream`), after warm-up.
template <typename Fn>
double TimeMs(cudaStream_t stream, int iters, Fn fn) {
  auto start = CreateEvent(true);
  auto stop = CreateEvent(true);
  BENCH_CHECK(start.status());
  BENCH_CHECK(stop.status());
  for (int i = 0; i < 3; ++i) fn();
  BENCH_CUDA(cudaEventRecord(start->get(), stream));
  for (int i = 0; i < iters; ++i) fn();
  BENCH_CUDA(cudaEventRecord(stop->get(), stream));
  BENCH_CUDA(cudaEventSynchronize(stop->get()));
  float ms = 0;
  BENCH_CUDA(cudaEventElapsedTime(&ms, start->get(), stop->get()));
  return ms / iters;
}

int Main(int argc, char** argv) {
  int iters = 50;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--iters=", 8) == 0) iters = std::atoi(argv[i] + 8);
  }
  if (CudaDeviceCount() == 0) {
    std::printf("matmul_bench: no CUDA device visible, nothing to measure\n");
    return 0;
  }
  auto created = CreateCudaBackend(0);
  BENCH_CHECK(created.status());
  auto* backend = static_cast<CudaBackend*>(created->get());
  cudaStream_t stream = backend->stream();
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);

  const int64_t kA = 5120, kB = 17408;
  const size_t n = static_cast<size_t>(kA * kB);
  std::vector<uint16_t> host(n);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (auto& h : host) {
    const float f = dist(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    h = static_cast<uint16_t>(bits >> 16);
  }
  const double weight_bytes = static_cast<double>(n) * 2;

  // Copy bandwidth on a buffer the size of the weight.
  auto src = backend->Allocate(n * 2);
  auto dst = backend->Allocate(n * 2);
  BENCH_CHECK(src.status());
  BENCH_CHECK(dst.status());
  const double copy_ms = TimeMs(stream, iters, [&] {
    BENCH_CHECK(backend->CopyOnDevice(dst->data(), src->data(), n * 2));
  });
  const double copy_gbs = 2 * weight_bytes / (copy_ms * 1e6);
  std::printf("cudaMemcpy D2D %.1f MB: %.3f ms, %.0f GB/s (read+write), %.0f GB/s read-only\n",
              weight_bytes / 1e6, copy_ms, copy_gbs, copy_gbs / 2);

  std::printf("\n%-22s %4s %10s %14s %12s %12s\n", "weight [out][in]", "T", "us/call",
              "weight GB/s", "% of copy", "GFLOP/s");
  for (int orient = 0; orient < 2; ++orient) {
    const int64_t out = orient == 0 ? kA : kB;
    const int64_t in = orient == 0 ? kB : kA;
    auto w = backend->UploadWeight(DType::kBF16, host.data(), out, in);
    BENCH_CHECK(w.status());
    for (int t : {1, 2, 4, 8, 16, 64}) {
      std::vector<float> xh(static_cast<size_t>(t * in));
      for (auto& v : xh) v = dist(rng);
      auto x = backend->AllocateFloats(xh.size());
      auto y = backend->AllocateFloats(static_cast<size_t>(t * out));
      BENCH_CHECK(x.status());
      BENCH_CHECK(y.status());
      BENCH_CHECK(backend->CopyToDevice(x->data(), xh.data(), xh.size() * 4));
      const MatmulParams p = DenseMatmul(t, x->f32(), *w, y->f32());
      const double ms = TimeMs(stream, iters, [&] { BENCH_CHECK(backend->Matmul(p)); });
      const double gbs = weight_bytes / (ms * 1e6);
      const double gflops = 2.0 * t * in * out / (ms * 1e6);
      char label[32];
      std::snprintf(label, sizeof(label), "bf16 [%lld][%lld]", static_cast<long long>(out),
                    static_cast<long long>(in));
      std::printf("%-22s %4d %10.1f %14.0f %11.1f%% %12.0f\n", label, t, ms * 1e3, gbs,
                  100.0 * gbs / copy_gbs, gflops);
    }
  }
  BENCH_CHECK(backend->Synchronize());
  std::printf(
      "\n%% of copy = weight bytes/s of the matmul over the copy's bytes moved/s (read +\n"
      "write: the memory system's measured ceiling; the weight is 3x the L2, so each\n"
      "call streams it from HBM).\n");
  return 0;
}

}  // namespace
}  // namespace specserve::kernels::cuda

int main(int argc, char** argv) { return specserve::kernels::cuda::Main(argc, argv); }
