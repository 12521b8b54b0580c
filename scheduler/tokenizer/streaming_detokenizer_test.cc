#include "scheduler/tokenizer/streaming_detokenizer.h"

#include <random>
#include <string>
#include <vector>

#include "glog/logging.h"
#include "gtest/gtest.h"
#include "scheduler/tokenizer/byte_level.h"
#include "scheduler/tokenizer/unicode.h"

namespace specserve::tokenizer {
namespace {

constexpr char kQwen2Style[] =
    "tests/tokenizer/data/qwen2_style/tokenizer.json";

class StreamingDetokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = Tokenizer::Load(kQwen2Style);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = std::move(tok).value();
  }
  // The id of the one-byte token for `b`.
  uint32_t ByteId(uint8_t b) {
    auto id =
        tok_->TokenToId(BytesToByteLevel(std::string(1, static_cast<char>(b))));
    CHECK(id.has_value());
    return *id;
  }
  // Feeds all ids; checks each piece is valid UTF-8; returns the concatenation.
  std::string Stream(const std::vector<uint32_t>& ids,
                     bool skip_special = false) {
    StreamingDetokenizer detok(tok_.get(), skip_special);
    std::string all;
    for (uint32_t id : ids) {
      auto piece = detok.Feed(id);
      EXPECT_TRUE(piece.ok()) << piece.status();
      EXPECT_TRUE(IsValidUtf8(*piece));
      all += *piece;
    }
    const std::string tail = detok.Finish();
    EXPECT_TRUE(IsValidUtf8(tail));
    return all + tail;
  }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(StreamingDetokenizerTest, HoldsBackASplitCharacter) {
  // "你" is E4 BD A0; fed one byte token at a time.
  StreamingDetokenizer detok(tok_.get());
  EXPECT_EQ(*detok.Feed(*tok_->TokenToId("a")), "a");
  EXPECT_EQ(*detok.Feed(ByteId(0xE4)), "");
  EXPECT_EQ(detok.pending_bytes(), 1u);
  EXPECT_EQ(*detok.Feed(ByteId(0xBD)), "");
  EXPECT_EQ(detok.pending_bytes(), 2u);
  EXPECT_EQ(*detok.Feed(ByteId(0xA0)), "\u4F60");
  EXPECT_EQ(detok.pending_bytes(), 0u);
  EXPECT_EQ(detok.Finish(), "");
}

TEST_F(StreamingDetokenizerTest, FourByteEmojiAcrossTokens) {
  const std::vector<uint32_t> ids = {ByteId(0xF0), ByteId(0x9F), ByteId(0x98),
                                     ByteId(0x80)};
  StreamingDetokenizer detok(tok_.get());
  for (size_t i = 0; i + 1 < ids.size(); ++i)
    EXPECT_EQ(*detok.Feed(ids[i]), "");
  EXPECT_EQ(*detok.Feed(ids.back()), "\U0001F600");
}

TEST_F(StreamingDetokenizerTest, BrokenCharacterBecomesReplacementLikeDecode) {
  const std::vector<uint32_t> ids = {ByteId(0xE4), ByteId(0xBD),
                                     *tok_->TokenToId("a")};
  StreamingDetokenizer detok(tok_.get());
  EXPECT_EQ(*detok.Feed(ids[0]), "");
  EXPECT_EQ(*detok.Feed(ids[1]), "");
  EXPECT_EQ(*detok.Feed(ids[2]),
            "\uFFFD"
            "a");
  EXPECT_EQ(Stream(ids), *tok_->Decode(ids));
}

TEST_F(StreamingDetokenizerTest, FinishFlushesAnIncompleteTail) {
  StreamingDetokenizer detok(tok_.get());
  EXPECT_EQ(*detok.Feed(ByteId(0xF0)), "");
  EXPECT_EQ(*detok.Feed(ByteId(0x9F)), "");
  EXPECT_EQ(detok.Finish(), "\uFFFD");
  EXPECT_EQ(detok.pending_bytes(), 0u);
  EXPECT_EQ(*tok_->Decode({ByteId(0xF0), ByteId(0x9F)}), "\uFFFD");
}

TEST_F(StreamingDetokenizerTest, UnknownIdIsAnErrorAndKeepsState) {
  StreamingDetokenizer detok(tok_.get());
  EXPECT_EQ(*detok.Feed(ByteId(0xE4)), "");
  EXPECT_FALSE(detok.Feed(tok_->vocab_size()).ok());
  EXPECT_EQ(detok.pending_bytes(), 1u);
  EXPECT_EQ(*detok.Feed(ByteId(0xBD)), "");
  EXPECT_EQ(*detok.Feed(ByteId(0xA0)), "\u4F60");
}

TEST_F(StreamingDetokenizerTest, SkipsSpecialTokensWhenAsked) {
  const std::vector<uint32_t> ids =
      tok_->Encode("<|im_start|>hi \u4F60<|im_end|>");
  EXPECT_EQ(Stream(ids, /*skip_special=*/true), "hi \u4F60");
  EXPECT_EQ(Stream(ids), "<|im_start|>hi \u4F60<|im_end|>");
}

TEST_F(StreamingDetokenizerTest, ConcatenationEqualsDecodeForRandomIds) {
  // Random sequences biased to single-byte tokens, which split characters.
  std::mt19937 rng(42);
  std::vector<uint32_t> bytes;
  for (int b = 0x80; b < 0x100; ++b) bytes.push_back(ByteId(b));
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint32_t> ids(rng() % 16);
    for (uint32_t& id : ids) {
      id = rng() % 3 != 0 ? bytes[rng() % bytes.size()]
                          : rng() % tok_->vocab_size();
    }
    ASSERT_EQ(Stream(ids), *tok_->Decode(ids)) << "trial " << trial;
  }
}

TEST_F(StreamingDetokenizerTest, ConcatenationEqualsDecodeForEncodedText) {
  const std::string text =
      "emoji \U0001F468\u200D\U0001F469\u200D\U0001F467 \U0001F44D\U0001F3FD, "
      "CJK \u4F60\u597D\u4E16\u754C, caf\u00E9, \uFFFD, tabs\t\tand\r\nlines";
  const std::vector<uint32_t> ids = tok_->Encode(text);
  EXPECT_EQ(Stream(ids), text);
}

}  // namespace
}  // namespace specserve::tokenizer
