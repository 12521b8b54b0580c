#include "worker/model_files/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "telemetry/status_macros.h"
#include "worker/model_files/json_util.h"

namespace specserve::model_files {
namespace {

using nlohmann::json;

absl::Status Errno(const std::string& path, const char* what) {
  const int err = errno;
  std::string msg = absl::StrCat(path, ": ", what, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  return absl::InternalError(msg);
}

bool ParseDType(const std::string& s, DType* out) {
  if (s == "BF16") {
    *out = DType::kBF16;
  } else if (s == "F16") {
    *out = DType::kF16;
  } else if (s == "F32") {
    *out = DType::kF32;
  } else {
    return false;
  }
  return true;
}

// Checks one header entry and fills `e` (offsets still data-relative).
absl::Status ParseEntry(const std::string& name, const json& v,
                        uint64_t data_size, const std::string& source,
                        SafetensorsEntry* e) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": tensor '", name, "': ", why));
  };
  if (!v.is_object()) return bad("header entry is not an object");
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) return bad("missing 'dtype'");
  if (dt->get<std::string>() == "F8_E4M3") {
    e->f8_e4m3 = true;  // FP8 weights: the checkpoint dequantizes them
  } else if (!ParseDType(dt->get<std::string>(), &e->dtype)) {
    return bad(absl::StrCat("unsupported dtype '", dt->get<std::string>(),
                            "' (supported: BF16, F16, F32, F8_E4M3)"));
  }
  auto shape = v.find("shape");
  if (shape == v.end() || !shape->is_array()) return bad("missing 'shape'");
  uint64_t numel = 1;
  for (const json& d : *shape) {
    int64_t x = -1;
    if (!JsonToInt64(d, &x) || x < 0) {
      return bad(absl::StrCat("bad shape ", shape->dump()));
    }
    e->shape.push_back(x);
    // Bound the product so it cannot overflow.
    if (x != 0 && numel > (uint64_t{1} << 52) / static_cast<uint64_t>(x)) {
      return bad(absl::StrCat("shape ", shape->dump(), " is too large"));
    }
    numel *= static_cast<uint64_t>(x);
  }
  auto off = v.find("data_offsets");
  int64_t begin = -1, end = -1;
  if (off == v.end() || !off->is_array() || off->size() != 2 ||
      !JsonToInt64((*off)[0], &begin) || !JsonToInt64((*off)[1], &end)) {
    return bad("missing or malformed 'data_offsets'");
  }
  if (begin < 0 || end < begin || static_cast<uint64_t>(end) > data_size) {
    return bad(absl::StrCat("data_offsets [", begin, ", ", end,
                            "] outside the data region of ", data_size,
                            " bytes"));
  }
  const uint64_t want = numel * (e->f8_e4m3 ? 1 : DTypeSize(e->dtype));
  if (static_cast<uint64_t>(end - begin) != want) {
    return bad(absl::StrCat(
        "data_offsets [", begin, ", ", end, "] span ", end - begin,
        " bytes but shape [", absl::StrJoin(e->shape, ", "), "] of ",
        e->f8_e4m3 ? "f8_e4m3" : DTypeName(e->dtype), " needs ", want));
  }
  e->name = name;
  e->offset = static_cast<size_t>(begin);
  e->nbytes = static_cast<size_t>(want);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<MappedRegion>> MappedRegion::Open(
    const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno(path, "cannot open");
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    absl::Status s = Errno(path, "cannot stat");
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* p = nullptr;
  if (size > 0) {
    p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      absl::Status s = Errno(path, "cannot mmap");
      ::close(fd);
      return s;
    }
  }
  ::close(fd);  // the mapping keeps the file referenced
  return std::unique_ptr<MappedRegion>(
      new MappedRegion(static_cast<const uint8_t*>(p), size));
}

MappedRegion::~MappedRegion() {
  if (data_ != nullptr) {
    ::munmap(const_cast<uint8_t*>(data_), size_);
  }
}

absl::StatusOr<std::vector<SafetensorsEntry>> ParseSafetensors(
    const uint8_t* data, size_t size, const std::string& source) {
  if (size < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": truncated: ", size,
                     " bytes, shorter than the 8-byte header length"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n > size - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": truncated: header length is ", n,
                     " bytes but only ", size - 8, " bytes follow"));
  }
  json header;
  SS_RETURN_IF_ERROR(
      ParseJson(std::string_view(reinterpret_cast<const char*>(data) + 8, n),
                absl::StrCat(source, " (safetensors header)"), &header));
  if (!header.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": safetensors header is not a JSON object"));
  }
  const uint64_t data_start = 8 + n;
  const uint64_t data_size = size - data_start;
  std::vector<SafetensorsEntry> entries;
  entries.reserve(header.size());
  try {  // keep any nlohmann exception inside this adapter
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") continue;
      SafetensorsEntry e;
      SS_RETURN_IF_ERROR(
          ParseEntry(it.key(), it.value(), data_size, source, &e));
      e.offset += data_start;
      entries.push_back(std::move(e));
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": bad safetensors header: ", e.what()));
  }
  return entries;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path) {
  auto file = std::make_unique<SafetensorsFile>();
  file->path = path;
  SS_ASSIGN_OR_RETURN(file->region, MappedRegion::Open(path));
  SS_ASSIGN_OR_RETURN(
      file->entries,
      ParseSafetensors(file->region->data(), file->region->size(), path));
  return file;
}

}  // namespace specserve::model_files
