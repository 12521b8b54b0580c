#include "worker/model_files/json_util.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace specserve::model_files {

absl::Status ParseJson(std::string_view text, const std::string& source,
                       nlohmann::json* out) {
  try {
    *out = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": bad JSON at byte ", e.byte, ": ", e.what()));
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": bad JSON: ", e.what()));
  }
  return absl::OkStatus();
}

bool JsonToInt64(const nlohmann::json& v, int64_t* out) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return false;
    }
    *out = v.get<int64_t>();
    return true;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9e15) {
      return false;
    }
    *out = static_cast<int64_t>(d);
    return true;
  }
  return false;
}

absl::Status ReadTextFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat(path, ": file not found"));
    }
    return absl::InternalError(
        absl::StrCat(path, ": cannot open: ", std::strerror(err)));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) {
    return absl::InternalError(absl::StrCat(path, ": read error"));
  }
  *out = ss.str();
  return absl::OkStatus();
}

}  // namespace specserve::model_files
