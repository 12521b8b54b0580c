// Small adapters between nlohmann::json and absl::Status used by the model
// files loader: no nlohmann exception leaves these functions.
#ifndef SPECSERVE_WORKER_MODEL_FILES_JSON_UTIL_H_
#define SPECSERVE_WORKER_MODEL_FILES_JSON_UTIL_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace specserve::model_files {

// Parses `text` into `*out`. On bad JSON returns INVALID_ARGUMENT naming
// `source` and the byte position of the error.
absl::Status ParseJson(std::string_view text, const std::string& source,
                       nlohmann::json* out);

// True when `v` is an integer (or a float with an integral value) that fits
// int64; stores it in `*out`.
bool JsonToInt64(const nlohmann::json& v, int64_t* out);

// Reads a whole file. NOT_FOUND when it does not exist, else INTERNAL on I/O
// errors; messages name `path`.
absl::Status ReadTextFile(const std::string& path, std::string* out);

}  // namespace specserve::model_files

#endif  // SPECSERVE_WORKER_MODEL_FILES_JSON_UTIL_H_
