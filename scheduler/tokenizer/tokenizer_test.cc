#include "scheduler/tokenizer/tokenizer.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "scheduler/tokenizer/byte_level.h"

namespace specserve::tokenizer {
namespace {

using json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kQwen2Style[] =
    "tests/tokenizer/data/qwen2_style/tokenizer.json";
constexpr char kGpt2Style[] = "tests/tokenizer/data/gpt2_style/tokenizer.json";

std::unique_ptr<Tokenizer> LoadOrDie(const std::string& path) {
  auto tok = Tokenizer::Load(path);
  CHECK(tok.ok()) << tok.status();
  return std::move(tok).value();
}

// A small valid tokenizer.json: the 256 byte tokens (ids 0..255), merges
// "h e" -> 256, "he l" -> 257, "hel l" -> 258, "hell o" -> 259, "Ġ w" -> 260,
// and special <|end|> = 261.
json TinyTokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    vocab[BytesToByteLevel(std::string(1, static_cast<char>(b)))] = b;
  }
  vocab["he"] = 256;
  vocab["hel"] = 257;
  vocab["hell"] = 258;
  vocab["hello"] = 259;
  vocab["\u0120w"] = 260;
  return json{
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", json::array({{{"id", 261},
                                     {"content", "<|end|>"},
                                     {"single_word", false},
                                     {"lstrip", false},
                                     {"rstrip", false},
                                     {"normalized", false},
                                     {"special", true}}})},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "ByteLevel"},
        {"add_prefix_space", false},
        {"trim_offsets", true},
        {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", json::array({"h e", json::array({"he", "l"}), "hel l",
                                "hell o", "\u0120 w"})}}},
  };
}

std::unique_ptr<Tokenizer> FromJson(const json& j) {
  auto spec = ParseTokenizerJson(j.dump());
  CHECK(spec.ok()) << spec.status();
  auto tok = Tokenizer::FromSpec(std::move(spec).value());
  CHECK(tok.ok()) << tok.status();
  return std::move(tok).value();
}

// The error ParseTokenizerJson gives for `j` (which must be rejected).
std::string ParseError(const json& j) {
  auto spec = ParseTokenizerJson(j.dump());
  EXPECT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(spec.status().message());
}

TEST(TokenizerTest, TinyTokenizerMergesByRank) {
  auto tok = FromJson(TinyTokenizer());
  EXPECT_EQ(tok->vocab_size(), 262u);
  EXPECT_THAT(tok->Encode("hello"), ElementsAre(259));
  EXPECT_THAT(tok->Encode("hello w"), ElementsAre(259, 260));
  EXPECT_THAT(tok->Encode("help"), ElementsAre(257, 'p'));
  EXPECT_THAT(tok->Encode("hello<|end|>"), ElementsAre(259, 261));
  EXPECT_THAT(tok->Encode(""), ElementsAre());
  EXPECT_EQ(*tok->Decode({259, 260, 261}), "hello w<|end|>");
  EXPECT_EQ(*tok->Decode({259, 261}, /*skip_special=*/true), "hello");
}

TEST(TokenizerTest, LongWordsUseTheSameMergeOrder) {
  auto tok = FromJson(TinyTokenizer());
  std::string text;
  std::vector<uint32_t> expected;
  for (int i = 0; i < 40; ++i) {  // 200 bytes: takes the heap-based merge path
    text += "hello";
    expected.push_back(259);
  }
  EXPECT_EQ(tok->Encode(text), expected);
}

TEST(TokenizerTest, IgnoreMergesTakesWholeWords) {
  json j = TinyTokenizer();
  j["model"]["vocab"]["hw"] = 262;
  j["model"]["ignore_merges"] = true;
  EXPECT_THAT(FromJson(j)->Encode("hw"), ElementsAre(262));
  j["model"]["ignore_merges"] = false;
  EXPECT_THAT(FromJson(j)->Encode("hw"), ElementsAre('h', 'w'));
}

TEST(TokenizerTest, NormalizesToNfcBeforeBpe) {
  auto tok = FromJson(TinyTokenizer());
  // "é" decomposed in the input encodes like the composed character.
  EXPECT_EQ(tok->Encode("e\u0301"), tok->Encode("\u00E9"));
}

TEST(TokenizerTest, NormalizedAddedTokensMatchAndDecodeLikeHf) {
  json j = TinyTokenizer();
  j["added_tokens"].push_back({{"id", 262},
                               {"content", "cafe\u0301"},
                               {"single_word", false},
                               {"lstrip", false},
                               {"rstrip", false},
                               {"normalized", true},
                               {"special", false}});
  auto tok = FromJson(j);
  // Matched on NFC text, so both spellings of "café" hit it.
  EXPECT_THAT(tok->Encode("cafe\u0301 caf\u00E9"), ElementsAre(262, ' ', 262));
  // HF names and decodes it by its normalized content; the ByteLevel decoder
  // then reads U+00E9 as the byte 0xE9, which is not valid UTF-8 alone.
  EXPECT_EQ(*tok->IdToToken(262), "caf\u00E9");
  EXPECT_EQ(*tok->Decode({262}), "caf\uFFFD");
  EXPECT_EQ(*tok->TokenToId("cafe\u0301"), 262u);
}

TEST(TokenizerTest, InvalidUtf8InputIsRepaired) {
  auto tok = FromJson(TinyTokenizer());
  EXPECT_EQ(tok->Encode("a\xFF"
                        "b"),
            tok->Encode("a\uFFFD"
                        "b"));
}

TEST(TokenizerTest, RejectsWhatItDoesNotImplement) {
  {
    json j = TinyTokenizer();
    j["model"]["type"] = "WordPiece";
    EXPECT_THAT(ParseError(j), HasSubstr("model.type"));
  }
  {
    json j = TinyTokenizer();
    j["model"]["byte_fallback"] = true;
    EXPECT_THAT(ParseError(j), HasSubstr("model.byte_fallback"));
  }
  {
    json j = TinyTokenizer();
    j["model"]["dropout"] = 0.1;
    EXPECT_THAT(ParseError(j), HasSubstr("model.dropout"));
  }
  {
    json j = TinyTokenizer();
    j["model"]["continuing_subword_prefix"] = "##";
    EXPECT_THAT(ParseError(j), HasSubstr("model.continuing_subword_prefix"));
  }
  {
    json j = TinyTokenizer();
    j["normalizer"] = {{"type", "Sequence"},
                       {"normalizers", json::array({{{"type", "NFC"}},
                                                    {{"type", "Lowercase"}}})}};
    EXPECT_THAT(ParseError(j), HasSubstr("normalizer.normalizers[1].type"));
  }
  {
    json j = TinyTokenizer();
    j["pre_tokenizer"] = {{"type", "Whitespace"}};
    EXPECT_THAT(ParseError(j), HasSubstr("pre_tokenizer.type"));
  }
  {
    json j = TinyTokenizer();
    j["pre_tokenizer"] = nullptr;
    EXPECT_THAT(ParseError(j), HasSubstr("pre_tokenizer"));
  }
  {
    json j = TinyTokenizer();
    j["decoder"] = {{"type", "WordPiece"}};
    EXPECT_THAT(ParseError(j), HasSubstr("decoder.type"));
  }
  {
    json j = TinyTokenizer();
    j["post_processor"] = {{"type", "TemplateProcessing"}};
    EXPECT_THAT(ParseError(j), HasSubstr("post_processor.type"));
  }
  {
    json j = TinyTokenizer();
    j["truncation"] = {{"max_length", 5}};
    EXPECT_THAT(ParseError(j), HasSubstr("truncation"));
  }
}

TEST(TokenizerTest, RejectsMalformedFiles) {
  EXPECT_THAT(std::string(ParseTokenizerJson("{not json").status().message()),
              HasSubstr("not valid JSON"));
  EXPECT_THAT(std::string(ParseTokenizerJson("[1, 2]").status().message()),
              HasSubstr("not a JSON object"));
  {
    json j = TinyTokenizer();
    j["model"]["vocab"] = json::array({1, 2});
    EXPECT_THAT(ParseError(j), HasSubstr("model.vocab"));
  }
  {
    json j = TinyTokenizer();
    j["model"]["merges"][0] = "h e x";
    EXPECT_THAT(ParseError(j), HasSubstr("model.merges[0]"));
  }
  {
    json j = TinyTokenizer();
    j["added_tokens"][0]["id"] = "x";
    EXPECT_THAT(ParseError(j), HasSubstr("added_tokens[0].id"));
  }
  {
    json j = TinyTokenizer();
    j["added_tokens"][0]["special"] = "yes";
    EXPECT_THAT(ParseError(j), HasSubstr("added_tokens[0].special"));
  }
  {
    json j = TinyTokenizer();
    j["pre_tokenizer"] = {{"type", "Split"},
                          {"pattern", {{"Regex", "(unclosed"}}},
                          {"behavior", "Isolated"},
                          {"invert", false}};
    // Also a Split without a ByteLevel after it.
    EXPECT_THAT(ParseError(j), HasSubstr("ByteLevel"));
  }
  {
    // A merge naming an unknown token is caught when the model is built.
    json j = TinyTokenizer();
    j["model"]["merges"].push_back("x yz");
    auto spec = ParseTokenizerJson(j.dump());
    ASSERT_TRUE(spec.ok());
    auto tok = Tokenizer::FromSpec(std::move(spec).value());
    ASSERT_FALSE(tok.ok());
    EXPECT_THAT(std::string(tok.status().message()),
                HasSubstr("model.merges[5]"));
  }
}

TEST(TokenizerTest, BadRegexIsAnError) {
  json j = TinyTokenizer();
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers", json::array({{{"type", "Split"},
                                      {"pattern", {{"Regex", "(unclosed"}}},
                                      {"behavior", "Isolated"},
                                      {"invert", false}},
                                     {{"type", "ByteLevel"},
                                      {"add_prefix_space", false},
                                      {"use_regex", false}}})}};
  auto spec = ParseTokenizerJson(j.dump());
  ASSERT_TRUE(spec.ok());
  auto tok = Tokenizer::FromSpec(std::move(spec).value());
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr("(unclosed"));
}

TEST(TokenizerTest, LoadMissingFileIsNotFound) {
  auto tok = Tokenizer::Load("/nonexistent/tokenizer.json");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
}

// Ids below were produced by HF tokenizers 0.23.1 for the committed files.
TEST(TokenizerTest, Qwen2StyleMatchesHf) {
  auto tok = LoadOrDie(kQwen2Style);
  EXPECT_EQ(tok->vocab_size(), 6144u);
  EXPECT_THAT(tok->Encode("Hello world <|im_end|> it's"),
              ElementsAre(4108, 336, 5770, 1274, 223, 2, 539, 894));
}

TEST(TokenizerTest, Gpt2StyleAddedTokenFlagsMatchHf) {
  auto tok = LoadOrDie(kGpt2Style);
  // <mask> strips the whitespace around it; the next piece gets a prefix space.
  EXPECT_THAT(tok->Encode("  hello <mask>  world <|sep|>x"),
              ElementsAre(221, 10270, 392, 12001, 3263, 221, 12000, 3058));
  // [[word]] (single_word) only matches with no word character on either side.
  EXPECT_THAT(tok->Encode("a[[word]] [[word]] b"),
              ElementsAre(301, 59, 59, 2924, 5746, 221, 12002, 339));
}

TEST(TokenizerTest, SpecialTokens) {
  auto tok = LoadOrDie(kQwen2Style);
  const uint32_t im_start = *tok->TokenToId("<|im_start|>");
  const uint32_t im_end = *tok->TokenToId("<|im_end|>");
  const uint32_t eot = *tok->TokenToId("<|endoftext|>");
  EXPECT_TRUE(tok->IsSpecial(im_start));
  EXPECT_FALSE(tok->IsSpecial(*tok->TokenToId("a")));
  EXPECT_FALSE(tok->IsSpecial(tok->vocab_size() + 5));
  EXPECT_EQ(*tok->IdToToken(im_end), "<|im_end|>");
  EXPECT_FALSE(tok->IdToToken(tok->vocab_size()).has_value());
  // No config beside the file: the Qwen end tokens.
  EXPECT_THAT(tok->eos_token_ids(),
              ::testing::UnorderedElementsAre(eot, im_end));

  const std::string chat = "<|im_start|>user\nhi<|im_end|>";
  const std::vector<uint32_t> ids = tok->Encode(chat);
  EXPECT_EQ(ids.front(), im_start);
  EXPECT_EQ(ids.back(), im_end);
  EXPECT_EQ(*tok->Decode(ids), chat);
  EXPECT_EQ(*tok->Decode(ids, /*skip_special=*/true), "user\nhi");

  const std::vector<uint32_t> plain =
      tok->Encode(chat, /*parse_special=*/false);
  for (uint32_t id : plain) EXPECT_FALSE(tok->IsSpecial(id));
  EXPECT_EQ(*tok->Decode(plain), chat);
}

TEST(TokenizerTest, DecodeRejectsUnknownIds) {
  auto tok = LoadOrDie(kQwen2Style);
  const std::vector<uint32_t> ids = {1, tok->vocab_size()};
  auto text = tok->Decode(ids);
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TokenizerTest, ReadsConfigFilesBesideTheTokenizer) {
  const std::string dir = ::testing::TempDir() + "/with_config";
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  {
    std::ifstream in(kQwen2Style);
    std::ofstream out(dir + "/tokenizer.json");
    out << in.rdbuf();
  }
  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"eos_token": {"content": "<|im_end|>"}, "bos_token": null,
             "added_tokens_decoder": {
               "6144": {"content": "<|extra|>", "special": true, "lstrip": false,
                        "rstrip": false, "single_word": false, "normalized": false}}})";
  std::ofstream(dir + "/generation_config.json")
      << R"({"eos_token_id": [0, 2]})";
  auto tok = LoadOrDie(dir + "/tokenizer.json");
  EXPECT_THAT(tok->eos_token_ids(), ElementsAre(2, 0));
  EXPECT_EQ(tok->vocab_size(), 6145u);
  EXPECT_THAT(tok->Encode("<|extra|>"), ElementsAre(6144));
  EXPECT_TRUE(tok->IsSpecial(6144));

  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"eos_token": "<|nope|>"})";
  auto bad = Tokenizer::Load(dir + "/tokenizer.json");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("eos_token"));
}

TEST(TokenizerTest, ConcurrentEncodesAgree) {
  auto tok = LoadOrDie(kQwen2Style);
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) {
    texts.push_back("def f" + std::to_string(i) + "(x):\n    return x * " +
                    std::to_string(i * 7919) + "  # caf\u00E9 \u4F60\u597D");
  }
  std::vector<std::vector<uint32_t>> expected;
  for (const auto& t : texts) expected.push_back(tok->Encode(t));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          if (tok->Encode(texts[(i + t) % texts.size()]) !=
              expected[(i + t) % texts.size()]) {
            ++mismatches[t];
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_THAT(mismatches, ElementsAre(0, 0, 0, 0));
}

}  // namespace
}  // namespace specserve::tokenizer
