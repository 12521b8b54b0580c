// One safetensors file, memory-mapped read-only and its header parsed.
//
// Format: 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {}},
// then the data region; offsets are relative to the data region.
// Checkpoint (checkpoint.h) builds on this; nothing else should need it.
//
// Invariants after a successful Open()/Parse: every entry's dtype is one of
// DType, [offset, offset + nbytes) lies inside the file, and nbytes equals
// numel * DTypeSize(dtype). Tensor data is not guaranteed to be aligned
// (that depends on the writer); read it with memcpy or ToFloat.
#ifndef SPECSERVE_WORKER_MODEL_FILES_SAFETENSORS_H_
#define SPECSERVE_WORKER_MODEL_FILES_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model_files/checkpoint.h"

namespace specserve::model_files {

// A read-only private mapping of a whole file; unmapped on destruction.
// An empty file has data() == nullptr and size() == 0.
class MappedRegion {
 public:
  // NOT_FOUND when the file does not exist; errors name `path`.
  static absl::StatusOr<std::unique_ptr<MappedRegion>> Open(
      const std::string& path);
  ~MappedRegion();
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  MappedRegion(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  const uint8_t* data_;
  size_t size_;
};

struct SafetensorsEntry {
  std::string name;           // as stored in the file (not canonical)
  DType dtype = DType::kF32;  // unused when f8_e4m3
  // Stored as float8_e4m3fn (one byte per element): an FP8 checkpoint's
  // matrix, which Checkpoint dequantizes with its block scales.
  bool f8_e4m3 = false;
  std::vector<int64_t> shape;
  size_t offset = 0;  // from the start of the file
  size_t nbytes = 0;
};

// Parses and validates the header of the `size` bytes at `data`. `source`
// names the file in errors (INVALID_ARGUMENT).
absl::StatusOr<std::vector<SafetensorsEntry>> ParseSafetensors(
    const uint8_t* data, size_t size, const std::string& source);

// A mapped, validated safetensors file.
struct SafetensorsFile {
  std::string path;
  std::unique_ptr<MappedRegion> region;
  std::vector<SafetensorsEntry> entries;

  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path);
  const void* DataOf(const SafetensorsEntry& e) const {
    return region->data() + e.offset;
  }
};

}  // namespace specserve::model_files

#endif  // SPECSERVE_WORKER_MODEL_FILES_SAFETENSORS_H_
