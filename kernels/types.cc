#include "kernels/types.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/backend.h"

namespace specserve::kernels {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
  }
  LOG(FATAL) << "unknown dtype";
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
  }
  return "?";
}

absl::StatusOr<std::optional<DType>> ParseCacheDTypeFlag(
    absl::string_view flag, absl::string_view value) {
  if (value == "fp32") return DType::kF32;
  if (value == "bf16") return DType::kBF16;
  if (value == "auto") return std::nullopt;
  return absl::InvalidArgumentError(absl::StrCat(
      "--", flag, " must be fp32, bf16 or auto, got '", value, "'"));
}

const char* WeightLayoutName(WeightLayout layout) {
  switch (layout) {
    case WeightLayout::kRowMajor:
      return "row-major";
    case WeightLayout::kTensorCoreTiles:
      return "tensor-core tiles";
  }
  return "?";
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    owner_ = std::exchange(other.owner_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void Buffer::Reset() {
  if (data_ != nullptr) {
    CHECK(owner_ != nullptr) << "buffer without an owning backend";
    owner_->Free(data_);
  }
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace specserve::kernels
