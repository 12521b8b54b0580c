#include "tools/specgen/script.h"

#include "gtest/gtest.h"

namespace specserve::tools::specgen {
namespace {

TEST(ParseScript, ReadsEveryKind) {
  auto turns = ParseScript(R"([
      {"prompt": "def f(x):\n", "max_new": 8},
      {"prompt_ids": [5, 17]},
      {"rewind": true, "max_new": 0},
      {}])");
  ASSERT_TRUE(turns.ok()) << turns.status();
  ASSERT_EQ(turns->size(), 4u);
  EXPECT_EQ(*(*turns)[0].text, "def f(x):\n");
  EXPECT_EQ((*turns)[0].max_new, 8);
  EXPECT_EQ((*turns)[1].ids, (std::vector<int32_t>{5, 17}));
  EXPECT_FALSE((*turns)[1].max_new.has_value());
  EXPECT_TRUE((*turns)[2].rewind);
  EXPECT_EQ((*turns)[2].max_new, 0);
  EXPECT_FALSE((*turns)[3].text.has_value());
  EXPECT_TRUE((*turns)[3].ids.empty());
}

TEST(ParseScript, RefusesMalformedInputNamingTheTurn) {
  const std::pair<const char*, const char*> cases[] = {
      {"not json", "not valid JSON"},
      {"[]", "non-empty JSON list"},
      {R"({"prompt": "x"})", "non-empty JSON list"},
      {R"([{"prompt": 3}])", "turn 1: \"prompt\" must be a string"},
      {R"([{}, {"prompt_ids": [-1]}])", "turn 2: \"prompt_ids\""},
      {R"([{"max_new": 1.5}])", "\"max_new\""},
      {R"([{"rewind": 1}])", "\"rewind\""},
      {R"([{"promt": "x"}])", "unknown key \"promt\""},
      {R"([{"prompt": "x", "prompt_ids": [1]}])", "not both"},
      {R"([3])", "turn 1: expected a JSON object"},
  };
  for (const auto& [text, message] : cases) {
    auto turns = ParseScript(text);
    ASSERT_FALSE(turns.ok()) << text;
    EXPECT_EQ(turns.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(turns.status().message().find(message), std::string::npos)
        << text << " -> " << turns.status();
  }
}

}  // namespace
}  // namespace specserve::tools::specgen
