#include "tools/specgen/script.h"

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace specserve::tools::specgen {

using json = nlohmann::json;

absl::StatusOr<std::vector<ScriptTurn>> ParseScript(std::string_view text) {
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded())
    return absl::InvalidArgumentError("script: not valid JSON");
  if (!doc.is_array() || doc.empty())
    return absl::InvalidArgumentError(
        "script: expected a non-empty JSON list of turns");
  std::vector<ScriptTurn> turns;
  for (size_t i = 0; i < doc.size(); ++i) {
    const json& t = doc[i];
    const std::string where = absl::StrCat("script turn ", i + 1);
    if (!t.is_object())
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected a JSON object"));
    ScriptTurn turn;
    for (auto it = t.begin(); it != t.end(); ++it) {
      const std::string& key = it.key();
      const json& v = it.value();
      if (key == "prompt") {
        if (!v.is_string())
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": \"prompt\" must be a string"));
        turn.text = v.get<std::string>();
      } else if (key == "prompt_ids") {
        if (!v.is_array())
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": \"prompt_ids\" must be a list of ids"));
        for (const json& id : v) {
          if (!id.is_number_unsigned() || id.get<uint64_t>() > INT32_MAX)
            return absl::InvalidArgumentError(absl::StrCat(
                where,
                ": \"prompt_ids\" holds a value that is not a token id"));
          turn.ids.push_back(static_cast<int32_t>(id.get<uint64_t>()));
        }
      } else if (key == "max_new") {
        if (!v.is_number_unsigned() || v.get<uint64_t>() > INT32_MAX)
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": \"max_new\" must be a non-negative integer"));
        turn.max_new = static_cast<int>(v.get<uint64_t>());
      } else if (key == "rewind") {
        if (!v.is_boolean())
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": \"rewind\" must be true or false"));
        turn.rewind = v.get<bool>();
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": unknown key \"", key,
                         "\" (expected prompt, prompt_ids, max_new, rewind)"));
      }
    }
    if (turn.text && !turn.ids.empty())
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": give \"prompt\" or \"prompt_ids\", not both"));
    turns.push_back(std::move(turn));
  }
  return turns;
}

}  // namespace specserve::tools::specgen
