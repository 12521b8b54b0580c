#include "scheduler/vllm_engine/tokenizer_bundle.h"

#include <dirent.h>
#include <openssl/sha.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace specserve::scheduler::vllm_engine {
namespace {

constexpr const char* kFixedNames[] = {
    "tokenizer.json",
    "tokenizer_config.json",
    "config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.json",
};

// ZIP's limits without the ZIP64 extension.
constexpr uint64_t kMaxZipBytes = 0xFFFFFFFFu;
constexpr size_t kMaxEntries = 0xFFFF;
// 1980-01-01 00:00, the earliest DOS date: a fixed stamp keeps the archive's
// bytes (and digest) a function of the files alone.
constexpr uint16_t kDosTime = 0;
constexpr uint16_t kDosDate = (0 << 9) | (1 << 5) | 1;

void Put16(std::string* out, uint16_t v) {
  out->push_back(static_cast<char>(v & 0xFF));
  out->push_back(static_cast<char>(v >> 8));
}

void Put32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream s;
  s << f.rdbuf();
  if (f.bad()) return absl::InternalError(absl::StrCat("error reading ", path));
  return s.str();
}

}  // namespace

uint32_t Crc32(const std::string& data) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char b : data) crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

std::string Sha256Hex(const std::string& data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(),
         digest);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : digest) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 0xF]);
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> TokenizerFiles(
    const std::string& model_dir) {
  DIR* dir = opendir(model_dir.c_str());
  if (dir == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("cannot read the model directory ", model_dir));
  }
  std::vector<std::string> present;
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (e->d_type != DT_REG && e->d_type != DT_LNK && e->d_type != DT_UNKNOWN) {
      continue;
    }
    const bool fixed = std::find(std::begin(kFixedNames), std::end(kFixedNames),
                                 name) != std::end(kFixedNames);
    if (fixed || absl::EndsWith(name, ".jinja")) present.push_back(name);
  }
  closedir(dir);
  std::sort(present.begin(), present.end());
  if (present.empty()) {
    return absl::NotFoundError(absl::StrCat(
        model_dir, " has no tokenizer files (tokenizer.json, ...)"));
  }
  return present;
}

absl::StatusOr<std::string> BuildTokenizerZip(
    const std::string& model_dir, const std::vector<std::string>& files) {
  if (files.size() > kMaxEntries) {
    return absl::InvalidArgumentError("too many tokenizer files for a ZIP");
  }
  std::string zip, central;
  for (const std::string& name : files) {
    absl::StatusOr<std::string> data = ReadFile(model_dir + "/" + name);
    if (!data.ok()) return data.status();
    if (zip.size() + data->size() + name.size() + 30 > kMaxZipBytes) {
      return absl::InvalidArgumentError(
          "tokenizer files too large for a ZIP archive without ZIP64");
    }
    const uint32_t crc = Crc32(*data);
    const uint32_t offset = static_cast<uint32_t>(zip.size());
    const uint32_t size = static_cast<uint32_t>(data->size());
    // Local file header: stored (method 0), no data descriptor.
    Put32(&zip, 0x04034b50);
    Put16(&zip, 20);  // version needed: 2.0
    Put16(&zip, 0);   // flags
    Put16(&zip, 0);   // method: stored
    Put16(&zip, kDosTime);
    Put16(&zip, kDosDate);
    Put32(&zip, crc);
    Put32(&zip, size);
    Put32(&zip, size);
    Put16(&zip, static_cast<uint16_t>(name.size()));
    Put16(&zip, 0);  // extra length
    zip += name;
    zip += *data;
    // Its central directory entry.
    Put32(&central, 0x02014b50);
    Put16(&central, 20);  // version made by
    Put16(&central, 20);  // version needed
    Put16(&central, 0);
    Put16(&central, 0);
    Put16(&central, kDosTime);
    Put16(&central, kDosDate);
    Put32(&central, crc);
    Put32(&central, size);
    Put32(&central, size);
    Put16(&central, static_cast<uint16_t>(name.size()));
    Put16(&central, 0);  // extra length
    Put16(&central, 0);  // comment length
    Put16(&central, 0);  // disk number
    Put16(&central, 0);  // internal attributes
    Put32(&central, 0);  // external attributes
    Put32(&central, offset);
    central += name;
  }
  const uint32_t central_offset = static_cast<uint32_t>(zip.size());
  zip += central;
  // End of central directory.
  Put32(&zip, 0x06054b50);
  Put16(&zip, 0);
  Put16(&zip, 0);
  Put16(&zip, static_cast<uint16_t>(files.size()));
  Put16(&zip, static_cast<uint16_t>(files.size()));
  Put32(&zip, static_cast<uint32_t>(central.size()));
  Put32(&zip, central_offset);
  Put16(&zip, 0);  // comment length
  return zip;
}

}  // namespace specserve::scheduler::vllm_engine
