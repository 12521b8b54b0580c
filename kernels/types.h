// Element types, device buffers and weight handles shared by every compute
// backend. A Buffer is memory owned by one backend (host memory for the CPU
// backend, device memory for CUDA); pointers taken from it are only valid for
// that backend's ops and copy functions.
#ifndef SPECSERVE_KERNELS_TYPES_H_
#define SPECSERVE_KERNELS_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specserve::kernels {

// Storage type of weights. Activations, caches and states are always fp32.
enum class DType { kF32, kF16, kBF16 };
size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);

// A cache element type flag's value (--kv_cache_dtype,
// --recurrent_state_dtype): "fp32" or "bf16", or "auto" (nullopt: each tool
// resolves it). INVALID_ARGUMENT naming `flag` for anything else.
absl::StatusOr<std::optional<DType>> ParseCacheDTypeFlag(
    absl::string_view flag, absl::string_view value);

class Backend;

// Move-only owner of `bytes` bytes of backend memory. Empty (data()==nullptr)
// when default-constructed or moved from.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend* owner, void* data, size_t bytes)
      : owner_(owner), data_(data), bytes_(bytes) {}
  ~Buffer() { Reset(); }
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  float* f32() const { return static_cast<float*>(data_); }
  size_t bytes() const { return bytes_; }
  void Reset();

 private:
  Backend* owner_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// How a weight's elements lie in memory. kRowMajor: [rows][cols]. The CUDA
// backend keeps the bf16 matrices its tensor-core matmul reads as
// kTensorCoreTiles (kernels/cuda/tiled_weight.cuh): each warp's 64-k step of
// 16 rows is 2 KB in a row, so a block streams one contiguous range.
// Only the backend that made a weight chooses its layout; ops that read a
// weight (Matmul, Embed) take the layout with the pointer and refuse one
// they cannot read.
enum class WeightLayout { kRowMajor, kTensorCoreTiles };
const char* WeightLayoutName(WeightLayout layout);

// A 2-D weight matrix [rows][cols] in its storage dtype and `layout`,
// readable by the backend's ops. `storage` owns the data when the backend
// made a copy; it is empty when the backend reads the caller's memory in
// place (the CPU backend with memory-mapped checkpoints: the mapping must
// outlive the Weight), or when the Weight shares another's data (a tied
// lm_head).
struct Weight {
  DType dtype = DType::kF32;
  WeightLayout layout = WeightLayout::kRowMajor;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
  Buffer storage;

  // The matrix's own bytes (what a pass over it reads), not counting a
  // layout's padding.
  size_t bytes() const {
    return static_cast<size_t>(rows * cols) * DTypeSize(dtype);
  }
};

// fp32 to bf16, rounded to nearest even, with CUDA's __float2bfloat16_rn
// bits: every NaN becomes the canonical quiet NaN 0x7fff.
inline uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace specserve::kernels

#endif  // SPECSERVE_KERNELS_TYPES_H_
