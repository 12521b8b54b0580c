// Grammar-constrained generation on the default model's real tokenizer: walks
// that take only allowed tokens produce text that matches the grammar (JSON
// that parses and satisfies its schema, regex and EBNF matches, one of the
// choices), rollback and snapshots give back the same masks, and bad or
// oversized grammars are INVALID_ARGUMENT.
#include "worker/grammar/grammar.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/api_limits.h"

namespace specserve::grammar {
namespace {

using ::testing::HasSubstr;

constexpr char kModelDir[] = "models/specserve-tiny-py";  // models/default

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The bytes of each token of a byte-level tokenizer.json, decoded here with
// GPT-2's byte-to-character table (independently of xgrammar's decoding).
class ByteLevelDecoder {
 public:
  explicit ByteLevelDecoder(const std::string& tokenizer_json) {
    std::map<uint32_t, char> byte_of;
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      byte_of[printable ? b : 256 + next++] = static_cast<char>(b);
    }
    const nlohmann::json t = nlohmann::json::parse(tokenizer_json);
    for (const auto& [token, id] : t["model"]["vocab"].items()) {
      std::string bytes;
      for (uint32_t cp : Codepoints(token)) bytes += byte_of.at(cp);
      tokens_[id.get<int>()] = bytes;
      ids_[bytes] = id.get<int>();
    }
  }

  int Id(const std::string& bytes) const { return ids_.at(bytes); }

  std::string Decode(const std::vector<int32_t>& ids) const {
    std::string out;
    for (int32_t id : ids) out += tokens_.at(id);
    return out;
  }

 private:
  static std::vector<uint32_t> Codepoints(const std::string& s) {
    std::vector<uint32_t> out;
    for (size_t i = 0; i < s.size();) {
      const unsigned char c = s[i];
      const int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
      uint32_t cp = n == 1 ? c : c & (0x7F >> n);
      for (int k = 1; k < n; ++k) cp = (cp << 6) | (s[i + k] & 0x3F);
      out.push_back(cp);
      i += n;
    }
    return out;
  }

  std::map<int, std::string> tokens_;
  std::map<std::string, int> ids_;
};

// UTF-8 characters of `s` (JSON schema lengths count characters).
int Utf8Length(const std::string& s) {
  int n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::vector<int> AllowedTokens(const std::vector<int32_t>& mask, int vocab) {
  std::vector<int> out;
  for (int t = 0; t < vocab; ++t) {
    if ((static_cast<uint32_t>(mask[t / 32]) >> (t % 32)) & 1u)
      out.push_back(t);
  }
  return out;
}

struct Walk {
  std::vector<int32_t> tokens;  // without the stop token
  bool terminated = false;
};

constexpr int kStopToken = 6141;  // config.json eos_token_id
// After this many tokens a walk heads for the end (a free JSON object or
// string has no end of its own that a random walk would find).
constexpr int kFinishAfter = 200;
constexpr int kMaxWalkTokens = 1000;

// Drives `matcher` to the end of its grammar, one allowed token at a time.
// seed < 0: take the stop token as soon as it is allowed, else the lowest
// allowed id. Otherwise random: the stop token with probability 1/2 when it
// is allowed, else any other allowed token. Past kFinishAfter tokens, the
// stop token or else the first allowed of `finishers` is taken (tokens that
// close what is open).
Walk RunWalk(GrammarMatcher* matcher, int seed,
             const std::vector<int>& finishers = {}) {
  std::mt19937 rng(seed < 0 ? 0 : seed);
  std::vector<int32_t> mask(matcher->bitmask_words());
  Walk walk;
  while (static_cast<int>(walk.tokens.size()) < kMaxWalkTokens) {
    absl::StatusOr<int> allowed = matcher->FillMask(absl::MakeSpan(mask));
    EXPECT_TRUE(allowed.ok()) << allowed.status();
    if (!allowed.ok() || *allowed == 0) break;
    std::vector<int> ids = AllowedTokens(mask, matcher->vocab_size());
    EXPECT_EQ(static_cast<int>(ids.size()), *allowed);
    const bool can_stop = ids.back() == kStopToken;
    if (can_stop) ids.pop_back();
    const bool finishing = walk.tokens.size() >= kFinishAfter;
    int token = -1;
    if (finishing) {
      for (int f : finishers) {
        if (std::binary_search(ids.begin(), ids.end(), f)) {
          token = f;
          break;
        }
      }
    }
    if (can_stop && (ids.empty() || seed < 0 || finishing || rng() % 2 == 0)) {
      token = kStopToken;
    } else if (token < 0) {
      token = seed < 0 ? ids.front() : ids[rng() % ids.size()];
    }
    EXPECT_TRUE(matcher->Accept(token)) << token;
    if (token == kStopToken) {
      walk.terminated = true;
      break;
    }
    walk.tokens.push_back(token);
  }
  EXPECT_TRUE(walk.terminated) << "no end after " << walk.tokens.size();
  EXPECT_EQ(matcher->IsTerminated(), walk.terminated);
  return walk;
}

class GrammarTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto compiler = GrammarCompiler::FromModelDir(kModelDir);
    ASSERT_TRUE(compiler.ok()) << compiler.status();
    compiler_ = compiler->release();
    decoder_ = new ByteLevelDecoder(
        ReadFileOrDie(absl::StrCat(kModelDir, "/tokenizer.json")));
    finishers_ = new std::vector<int>;
    for (const char* closer : {"\"", "}", "]", ":", "0"}) {
      finishers_->push_back(decoder_->Id(closer));
    }
  }

  // The texts of walks over `spec`: the lowest-id walk and `random_walks`
  // random ones.
  static std::vector<std::string> Texts(const GrammarSpec& spec,
                                        int random_walks) {
    absl::StatusOr<CompiledGrammar> grammar = compiler_->Compile(spec);
    EXPECT_TRUE(grammar.ok()) << grammar.status();
    if (!grammar.ok()) return {};
    std::vector<std::string> texts;
    for (int seed = -1; seed < random_walks; ++seed) {
      absl::StatusOr<GrammarMatcher> matcher = GrammarMatcher::Create(*grammar);
      EXPECT_TRUE(matcher.ok()) << matcher.status();
      texts.push_back(
          decoder_->Decode(RunWalk(&*matcher, seed, *finishers_).tokens));
    }
    return texts;
  }

  static GrammarCompiler* compiler_;
  static ByteLevelDecoder* decoder_;
  static std::vector<int>* finishers_;
};

GrammarCompiler* GrammarTest::compiler_ = nullptr;
ByteLevelDecoder* GrammarTest::decoder_ = nullptr;
std::vector<int>* GrammarTest::finishers_ = nullptr;

constexpr char kPersonSchema[] = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "score": {"type": "number", "minimum": -1.5, "maximum": 2.5},
    "kind": {"enum": ["cat", "dog", "bird"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 5},
             "minItems": 1, "maxItems": 3},
    "address": {
      "type": "object",
      "properties": {
        "city": {"type": "string", "maxLength": 10},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"}
      },
      "required": ["city"]
    },
    "alive": {"type": "boolean"}
  },
  "required": ["name", "age", "kind", "tags", "address"]
})";

TEST_F(GrammarTest, JsonSchemaWalksGiveJsonThatSatisfiesTheSchema) {
  const std::set<std::string> keys = {"name", "age",     "score", "kind",
                                      "tags", "address", "alive"};
  for (const std::string& text :
       Texts({GrammarKind::kJsonSchema, kPersonSchema, {}}, 12)) {
    SCOPED_TRACE(text);
    const nlohmann::json v = nlohmann::json::parse(text, nullptr, false);
    ASSERT_TRUE(v.is_object());
    for (const auto& [key, value] : v.items()) EXPECT_TRUE(keys.count(key));
    ASSERT_TRUE(v.contains("name") && v["name"].is_string());
    EXPECT_GE(Utf8Length(v["name"]), 1);
    EXPECT_LE(Utf8Length(v["name"]), 12);
    ASSERT_TRUE(v.contains("age") && v["age"].is_number_integer());
    EXPECT_GE(v["age"].get<int64_t>(), 0);
    EXPECT_LE(v["age"].get<int64_t>(), 120);
    if (v.contains("score")) {
      ASSERT_TRUE(v["score"].is_number());
      EXPECT_GE(v["score"].get<double>(), -1.5);
      EXPECT_LE(v["score"].get<double>(), 2.5);
    }
    ASSERT_TRUE(v.contains("kind"));
    EXPECT_THAT((std::vector<std::string>{"cat", "dog", "bird"}),
                ::testing::Contains(v["kind"].get<std::string>()));
    ASSERT_TRUE(v.contains("tags") && v["tags"].is_array());
    EXPECT_GE(v["tags"].size(), 1u);
    EXPECT_LE(v["tags"].size(), 3u);
    for (const auto& tag : v["tags"]) {
      ASSERT_TRUE(tag.is_string());
      EXPECT_LE(Utf8Length(tag), 5);
    }
    ASSERT_TRUE(v.contains("address") && v["address"].is_object());
    const nlohmann::json& address = v["address"];
    ASSERT_TRUE(address.contains("city") && address["city"].is_string());
    EXPECT_LE(Utf8Length(address["city"]), 10);
    if (address.contains("zip")) {
      EXPECT_TRUE(std::regex_match(address["zip"].get<std::string>(),
                                   std::regex("[0-9]{5}")));
    }
    if (v.contains("alive")) {
      EXPECT_TRUE(v["alive"].is_boolean());
    }
  }
}

TEST_F(GrammarTest, JsonObjectWalksGiveJsonObjects) {
  for (const std::string& text : Texts({GrammarKind::kJsonObject, "", {}}, 8)) {
    SCOPED_TRACE(text);
    EXPECT_TRUE(nlohmann::json::parse(text, nullptr, false).is_object());
  }
}

TEST_F(GrammarTest, SpecialTokensAreNeverAllowed) {
  // Inside a free JSON string any text goes, but not a control token.
  absl::StatusOr<CompiledGrammar> grammar =
      compiler_->Compile({GrammarKind::kJsonObject, "", {}});
  ASSERT_TRUE(grammar.ok());
  absl::StatusOr<GrammarMatcher> m = GrammarMatcher::Create(*grammar);
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE(m->Accept(decoder_->Id("{")));
  ASSERT_TRUE(m->Accept(decoder_->Id("\"")));
  std::vector<int32_t> mask(m->bitmask_words());
  EXPECT_GT(*m->FillMask(absl::MakeSpan(mask)), 5000);
  const std::vector<int> ids = AllowedTokens(mask, m->vocab_size());
  for (int special : {6141, 6142, 6143}) {  // endoftext, im_start, im_end
    EXPECT_FALSE(std::binary_search(ids.begin(), ids.end(), special));
    EXPECT_FALSE(m->Accept(special));
  }
}

TEST_F(GrammarTest, RegexWalksMatchTheRegex) {
  for (const std::string& text :
       Texts({GrammarKind::kRegex, "[0-9]{3}-[a-z]+", {}}, 12)) {
    EXPECT_TRUE(std::regex_match(text, std::regex("[0-9]{3}-[a-z]+"))) << text;
  }
}

TEST_F(GrammarTest, EbnfWalksMatchTheGrammar) {
  const std::string ebnf = R"ebnf(
root ::= "(" expr ")"
expr ::= term ("+" term)*
term ::= [0-9]+ | "x"
)ebnf";
  for (const std::string& text : Texts({GrammarKind::kEbnf, ebnf, {}}, 12)) {
    EXPECT_TRUE(
        std::regex_match(text, std::regex(R"(\(([0-9]+|x)(\+([0-9]+|x))*\))")))
        << text;
  }
}

TEST_F(GrammarTest, ChoiceWalksGiveOneOfTheChoices) {
  const std::vector<std::string> choices = {"yes", "no", "say \"no\"\\",
                                            "naïve\ttab", "yes!"};
  std::set<std::string> seen;
  for (const std::string& text :
       Texts({GrammarKind::kChoice, "", choices}, 30)) {
    EXPECT_THAT(choices, ::testing::Contains(text));
    seen.insert(text);
  }
  EXPECT_GE(seen.size(), 3u) << "random walks reach several choices";
}

TEST_F(GrammarTest, AfterTheStopTokenNothingIsAllowed) {
  absl::StatusOr<CompiledGrammar> grammar =
      compiler_->Compile({GrammarKind::kChoice, "", {"ok"}});
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  absl::StatusOr<GrammarMatcher> m = GrammarMatcher::Create(*grammar);
  ASSERT_TRUE(m.ok());
  std::vector<int32_t> mask(m->bitmask_words());
  Walk walk = RunWalk(&*m, -1);
  EXPECT_EQ(decoder_->Decode(walk.tokens), "ok");
  EXPECT_TRUE(m->IsTerminated());
  EXPECT_TRUE(m->IsCompleted());
  EXPECT_EQ(*m->FillMask(absl::MakeSpan(mask)), 0);
  EXPECT_FALSE(m->Accept(kStopToken));
  EXPECT_FALSE(m->Accept(0));
  // The stop token rolls back like any other: the end is open again.
  ASSERT_TRUE(m->Rollback(1).ok());
  EXPECT_FALSE(m->IsTerminated());
  EXPECT_EQ(*m->FillMask(absl::MakeSpan(mask)), 1);
  EXPECT_EQ(AllowedTokens(mask, m->vocab_size()), std::vector<int>{kStopToken});
}

TEST_F(GrammarTest, TokensOutsideTheGrammarOrVocabularyAreRefused) {
  absl::StatusOr<CompiledGrammar> grammar =
      compiler_->Compile({GrammarKind::kRegex, "[0-9]+", {}});
  ASSERT_TRUE(grammar.ok());
  absl::StatusOr<GrammarMatcher> m = GrammarMatcher::Create(*grammar);
  ASSERT_TRUE(m.ok());
  std::vector<int32_t> mask(m->bitmask_words());
  ASSERT_GT(*m->FillMask(absl::MakeSpan(mask)), 0);
  for (int32_t t : {-1, m->vocab_size(), kStopToken}) {
    EXPECT_FALSE(m->Accept(t)) << t;
  }
  const std::vector<int> allowed = AllowedTokens(mask, m->vocab_size());
  int refused = 0;
  while (std::binary_search(allowed.begin(), allowed.end(), refused)) ++refused;
  EXPECT_FALSE(m->Accept(refused));
  EXPECT_EQ(m->num_accepted(), 0);
}

// Masks along a random walk, each before its token.
struct Recorded {
  std::vector<std::vector<int32_t>> masks;
  std::vector<int32_t> tokens;
};

Recorded Record(GrammarMatcher* m, int steps, int seed) {
  std::mt19937 rng(seed);
  Recorded r;
  for (int i = 0; i < steps; ++i) {
    std::vector<int32_t> mask(m->bitmask_words());
    EXPECT_GT(*m->FillMask(absl::MakeSpan(mask)), 0);
    std::vector<int> ids = AllowedTokens(mask, m->vocab_size());
    if (ids.back() == kStopToken && ids.size() > 1) ids.pop_back();
    const int token = ids[rng() % ids.size()];
    EXPECT_TRUE(m->Accept(token));
    r.masks.push_back(mask);
    r.tokens.push_back(token);
  }
  return r;
}

TEST_F(GrammarTest, RollbackThenReacceptGivesTheSameMasks) {
  absl::StatusOr<CompiledGrammar> grammar =
      compiler_->Compile({GrammarKind::kJsonSchema, kPersonSchema, {}});
  ASSERT_TRUE(grammar.ok());
  absl::StatusOr<GrammarMatcher> m = GrammarMatcher::Create(*grammar);
  ASSERT_TRUE(m.ok());
  constexpr int kSteps = 40;
  const Recorded r = Record(&*m, kSteps, 7);
  std::vector<int32_t> mask(m->bitmask_words());
  // A verify's deepest rejection, a single draft, and everything.
  for (int k : {kMaxDraftDepth + 1, 1, kSteps}) {
    SCOPED_TRACE(k);
    ASSERT_TRUE(m->Rollback(k).ok());
    EXPECT_EQ(m->num_accepted(), kSteps - k);
    for (int i = kSteps - k; i < kSteps; ++i) {
      ASSERT_TRUE(m->FillMask(absl::MakeSpan(mask)).ok());
      EXPECT_EQ(mask, r.masks[i]) << "step " << i;
      ASSERT_TRUE(m->Accept(r.tokens[i]));
    }
  }
  EXPECT_EQ(m->Rollback(kSteps + 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m->Rollback(-1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m->num_accepted(), kSteps);
}

TEST_F(GrammarTest, SnapshotRestoresTheMaskAndRefusesWhenGone) {
  absl::StatusOr<CompiledGrammar> grammar =
      compiler_->Compile({GrammarKind::kJsonSchema, kPersonSchema, {}});
  ASSERT_TRUE(grammar.ok());
  absl::StatusOr<GrammarMatcher> m = GrammarMatcher::Create(*grammar);
  ASSERT_TRUE(m.ok());
  const Recorded before = Record(&*m, 10, 3);
  const GrammarMatcher::Snapshot at10 = m->TakeSnapshot();
  std::vector<int32_t> mask10(m->bitmask_words());
  ASSERT_TRUE(m->FillMask(absl::MakeSpan(mask10)).ok());

  Record(&*m, 15, 4);
  ASSERT_TRUE(m->Restore(at10).ok());
  EXPECT_EQ(m->num_accepted(), 10);
  std::vector<int32_t> mask(m->bitmask_words());
  ASSERT_TRUE(m->FillMask(absl::MakeSpan(mask)).ok());
  EXPECT_EQ(mask, mask10);

  // Rolled back past the snapshot and regrown to its length: its tokens are
  // gone, whatever the length says.
  ASSERT_TRUE(m->Rollback(3).ok());
  Record(&*m, 3, 5);
  EXPECT_EQ(m->num_accepted(), 10);
  EXPECT_EQ(m->Restore(at10).code(), absl::StatusCode::kFailedPrecondition);
  // The start is always there.
  ASSERT_TRUE(m->Restore(GrammarMatcher::Snapshot{}).ok());
  ASSERT_TRUE(m->FillMask(absl::MakeSpan(mask)).ok());
  EXPECT_EQ(mask, before.masks[0]);
}

TEST_F(GrammarTest, ForkIsIndependent) {
  absl::StatusOr<CompiledGrammar> grammar =
      compiler_->Compile({GrammarKind::kJsonSchema, kPersonSchema, {}});
  ASSERT_TRUE(grammar.ok());
  absl::StatusOr<GrammarMatcher> m = GrammarMatcher::Create(*grammar);
  ASSERT_TRUE(m.ok());
  Record(&*m, 6, 11);
  std::vector<int32_t> parent_mask(m->bitmask_words());
  ASSERT_TRUE(m->FillMask(absl::MakeSpan(parent_mask)).ok());
  const GrammarMatcher::Snapshot at6 = m->TakeSnapshot();

  absl::StatusOr<GrammarMatcher> fork = m->Fork();
  ASSERT_TRUE(fork.ok());
  std::vector<int32_t> mask(m->bitmask_words());
  ASSERT_TRUE(fork->FillMask(absl::MakeSpan(mask)).ok());
  EXPECT_EQ(mask, parent_mask);
  Record(&*fork, 8, 12);
  ASSERT_TRUE(m->FillMask(absl::MakeSpan(mask)).ok());
  EXPECT_EQ(mask, parent_mask);
  EXPECT_EQ(m->num_accepted(), 6);
  ASSERT_TRUE(fork->Restore(at6).ok());
  ASSERT_TRUE(fork->FillMask(absl::MakeSpan(mask)).ok());
  EXPECT_EQ(mask, parent_mask);
}

TEST_F(GrammarTest, InvalidGrammarsAreInvalidArgumentWithTheParsersMessage) {
  const std::vector<GrammarSpec> bad = {
      {GrammarKind::kJsonSchema, R"({"type": "object", "properties": )", {}},
      {GrammarKind::kJsonSchema, R"({"type": "no_such_type"})", {}},
      {GrammarKind::kRegex, "[0-9", {}},
      {GrammarKind::kRegex, "(ab", {}},
      {GrammarKind::kEbnf, R"(root ::= "a" | )", {}},
      {GrammarKind::kEbnf, R"(start ::= "a")", {}},  // no root rule
      {GrammarKind::kEbnf, R"(root ::= undefined_rule)", {}},
  };
  for (const GrammarSpec& spec : bad) {
    SCOPED_TRACE(spec.text);
    absl::StatusOr<CompiledGrammar> grammar = compiler_->Compile(spec);
    ASSERT_FALSE(grammar.ok());
    EXPECT_EQ(grammar.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string prefix =
        absl::StrCat("invalid ", GrammarKindName(spec.kind), ": ");
    EXPECT_THAT(grammar.status().message(), HasSubstr(prefix));
    EXPECT_GT(grammar.status().message().size(), prefix.size() + 5)
        << "the parser says what is wrong";
  }
  // A message that quotes the whole (bad) text is cut.
  const std::string long_bad =
      R"({"description": ")" + std::string(20000, 'x') + R"(", "type": )";
  absl::StatusOr<CompiledGrammar> cut =
      compiler_->Compile({GrammarKind::kJsonSchema, long_bad, {}});
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(cut.status().message().size(), 1200u);
  absl::StatusOr<CompiledGrammar> none =
      compiler_->Compile({GrammarKind::kChoice, "", {}});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  // Refused specs are not cached.
  const int entries = compiler_->cache_entries();
  EXPECT_FALSE(compiler_->Compile(bad[0]).ok());
  EXPECT_EQ(compiler_->cache_entries(), entries);
}

TEST_F(GrammarTest, OversizedGrammarsAreRefusedNamingTheLimit) {
  // A valid schema of exactly the limit compiles; one byte more is refused.
  const std::string head = R"({"type": "string", "description": ")";
  const std::string tail = R"("})";
  std::string schema =
      head +
      std::string(kMaxGrammarTextBytes - head.size() - tail.size(), 'd') + tail;
  ASSERT_EQ(schema.size(), kMaxGrammarTextBytes);
  EXPECT_TRUE(compiler_->Compile({GrammarKind::kJsonSchema, schema, {}}).ok());
  schema.insert(head.size(), "d");
  for (const GrammarSpec& spec :
       {GrammarSpec{GrammarKind::kJsonSchema, schema, {}},
        GrammarSpec{GrammarKind::kRegex, std::string(70000, 'a'), {}},
        GrammarSpec{GrammarKind::kEbnf, std::string(70000, ' '), {}},
        GrammarSpec{GrammarKind::kChoice, "",
                    std::vector<std::string>(2000, std::string(40, 'c'))}}) {
    absl::StatusOr<CompiledGrammar> grammar = compiler_->Compile(spec);
    EXPECT_EQ(grammar.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(grammar.status().message(), HasSubstr("over the limit 65536"));
  }
}

TEST_F(GrammarTest, CompilesAreCached) {
  const GrammarSpec spec{GrammarKind::kRegex, "(red|green|blue)[0-9]", {}};
  ASSERT_TRUE(compiler_->Compile(spec).ok());
  const int entries = compiler_->cache_entries();
  const size_t bytes = compiler_->cache_bytes();
  ASSERT_TRUE(compiler_->Compile(spec).ok());
  EXPECT_EQ(compiler_->cache_entries(), entries);
  EXPECT_EQ(compiler_->cache_bytes(), bytes);
  // The same text as another kind is another grammar.
  ASSERT_TRUE(
      compiler_->Compile({GrammarKind::kEbnf, R"(root ::= "red")", {}}).ok());
  ASSERT_TRUE(
      compiler_->Compile({GrammarKind::kRegex, R"(root ::= "red")", {}}).ok());
  EXPECT_EQ(compiler_->cache_entries(), entries + 2);
}

TEST(GrammarCacheTest, ConcurrentCompilesShareOneEntry) {
  auto compiler = GrammarCompiler::FromModelDir(kModelDir);
  ASSERT_TRUE(compiler.ok()) << compiler.status();
  const GrammarSpec spec{GrammarKind::kJsonSchema, kPersonSchema, {}};
  std::vector<std::thread> threads;
  std::atomic<int> compiled{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] { compiled += (*compiler)->Compile(spec).ok(); });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(compiled.load(), 4);
  EXPECT_EQ((*compiler)->cache_entries(), 1);
}

TEST(GrammarCacheTest, EvictsTheLeastRecentlyUsedPastItsBounds) {
  GrammarCompilerOptions options;
  options.cache_entries = 2;
  auto compiler = GrammarCompiler::FromModelDir(kModelDir, options);
  ASSERT_TRUE(compiler.ok()) << compiler.status();
  const GrammarSpec a{GrammarKind::kRegex, "a+", {}};
  const GrammarSpec b{GrammarKind::kRegex, "b+", {}};
  const GrammarSpec c{GrammarKind::kRegex, "c+", {}};
  ASSERT_TRUE((*compiler)->Compile(a).ok());
  ASSERT_TRUE((*compiler)->Compile(b).ok());
  ASSERT_TRUE((*compiler)->Compile(a).ok());  // b is now the oldest
  ASSERT_TRUE((*compiler)->Compile(c).ok());
  EXPECT_EQ((*compiler)->cache_entries(), 2);
  const size_t bytes = (*compiler)->cache_bytes();
  ASSERT_TRUE((*compiler)->Compile(a).ok());  // still cached
  EXPECT_EQ((*compiler)->cache_bytes(), bytes);
}

TEST(ApplyBitmaskTest, MasksExactlyTheZeroBits) {
  const int vocab = 70;
  std::vector<int32_t> mask(BitmaskWords(vocab), 0);
  ASSERT_EQ(mask.size(), 3u);
  for (int t : {0, 31, 32, 69})
    mask[t / 32] |= static_cast<int32_t>(1u << (t % 32));
  std::vector<float> logits(vocab, 1.5f);
  ApplyBitmask(mask, absl::MakeSpan(logits));
  for (int t = 0; t < vocab; ++t) {
    if (t == 0 || t == 31 || t == 32 || t == 69) {
      EXPECT_EQ(logits[t], 1.5f) << t;
    } else {
      EXPECT_TRUE(std::isinf(logits[t]) && logits[t] < 0) << t;
    }
  }
}

// A tokenizer with digits and "<eos>" only: a grammar that needs a letter
// after a digit runs into a dead end.
TEST(GrammarDeadEndTest, NoAllowedTokenBeforeTheEndIsADeadEnd) {
  nlohmann::json t;
  t["model"]["type"] = "BPE";
  for (int d = 0; d < 10; ++d) t["model"]["vocab"][std::to_string(d)] = d;
  t["added_tokens"] = {{{"id", 10}, {"content", "<eos>"}, {"special", true}}};
  t["decoder"] = {{"type", "ByteLevel"}};
  auto compiler = GrammarCompiler::FromTokenizerJson(t.dump(), 16, {10});
  ASSERT_TRUE(compiler.ok()) << compiler.status();
  absl::StatusOr<CompiledGrammar> grammar =
      (*compiler)->Compile({GrammarKind::kEbnf, R"(root ::= [0-9] "x")", {}});
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  absl::StatusOr<GrammarMatcher> m = GrammarMatcher::Create(*grammar);
  ASSERT_TRUE(m.ok());
  std::vector<int32_t> mask(m->bitmask_words());
  EXPECT_EQ(*m->FillMask(absl::MakeSpan(mask)), 10);
  ASSERT_TRUE(m->Accept(3));
  EXPECT_EQ(*m->FillMask(absl::MakeSpan(mask)), 0);
  EXPECT_FALSE(m->IsTerminated());
  EXPECT_FALSE(m->IsCompleted());
}

TEST(GrammarCompilerTest, BadTokenizerInputsAreInvalidArgument) {
  const std::string ok = R"({"model": {"vocab": {"a": 0, "b": 1}}})";
  EXPECT_TRUE(GrammarCompiler::FromTokenizerJson(ok, 8, {1}).ok());
  for (const auto& [json, vocab, stop] :
       std::vector<std::tuple<std::string, int, std::vector<int32_t>>>{
           {"not json", 8, {1}},
           {R"({"model": {}})", 8, {1}},
           {R"({"model": {"vocab": {"a": "zero"}}})", 8, {1}},
           {ok, 8, {}},   // no stop token
           {ok, 8, {8}},  // outside the vocabulary
           {ok, 0, {0}},
       }) {
    EXPECT_EQ(
        GrammarCompiler::FromTokenizerJson(json, vocab, stop).status().code(),
        absl::StatusCode::kInvalidArgument)
        << json;
  }
  EXPECT_EQ(GrammarCompiler::FromModelDir("/no/such/model").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace specserve::grammar
