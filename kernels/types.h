// Element types, device buffers and weight handles shared by every compute
// backend. A Buffer is memory owned by one backend (host memory for the CPU
// backend, device memory for CUDA); pointers taken from it are only valid for
// that backend's ops and copy functions.
#ifndef SPECSERVE_KERNELS_TYPES_H_
#define SPECSERVE_KERNELS_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <utility>

namespace specserve::kernels {

// Storage type of weights. Activations, caches and states are always fp32.
enum class DType { kF32, kF16, kBF16 };
size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);

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

// A 2-D weight matrix [rows][cols], row-major, in its storage dtype, readable
// by the backend's ops. `storage` owns the data when the backend made a copy;
// it is empty when the backend reads the caller's memory in place (the CPU
// backend with memory-mapped checkpoints: the mapping must outlive the
// Weight).
struct Weight {
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
  Buffer storage;

  size_t bytes() const {
    return static_cast<size_t>(rows * cols) * DTypeSize(dtype);
  }
};

}  // namespace specserve::kernels

#endif  // SPECSERVE_KERNELS_TYPES_H_
