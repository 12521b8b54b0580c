// specgen --script FILE: a multi-turn conversation run on one session. The
// file is a JSON list of turns:
//
//   [{"prompt": "def f(x):\n", "max_new": 32},
//    {"prompt_ids": [5, 17], "max_new": 16},
//    {"prompt": "    return", "rewind": true}]
//
// Each turn gives its input as "prompt" (text, tokenized with the model's
// tokenizer.json) or "prompt_ids", or neither (continue generating);
// "max_new" defaults to --max-new; "rewind" goes back to the last turn's
// prompt checkpoint first ("regenerate"). Unknown keys are refused so that a
// typo does not silently change a run.
#ifndef SPECSERVE_TOOLS_SPECGEN_SCRIPT_H_
#define SPECSERVE_TOOLS_SPECGEN_SCRIPT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace specserve::tools::specgen {

struct ScriptTurn {
  std::optional<std::string> text;  // "prompt"
  std::vector<int32_t> ids;         // "prompt_ids"
  std::optional<int> max_new;       // absent = the --max-new default
  bool rewind = false;
};

// INVALID_ARGUMENT naming the turn (1-based) and key at fault.
absl::StatusOr<std::vector<ScriptTurn>> ParseScript(std::string_view json);

}  // namespace specserve::tools::specgen

#endif  // SPECSERVE_TOOLS_SPECGEN_SCRIPT_H_
