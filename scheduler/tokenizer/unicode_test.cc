#include "scheduler/tokenizer/unicode.h"

#include <string>

#include "gtest/gtest.h"
#include "scheduler/tokenizer/byte_level.h"

namespace specserve::tokenizer {
namespace {

TEST(Utf8Test, Validation) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii text, longer than eight bytes"));
  EXPECT_TRUE(
      IsValidUtf8("\xC3\xA9\xE4\xBD\xA0\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF"));
  EXPECT_FALSE(IsValidUtf8("\xC0\x80"));          // overlong
  EXPECT_FALSE(IsValidUtf8("\xE0\x80\x80"));      // overlong
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xE4\xBD"));          // truncated
  EXPECT_FALSE(IsValidUtf8("\x80"));              // stray continuation
  EXPECT_FALSE(IsValidUtf8("\xFF"));
}

TEST(Utf8Test, LossyReplacesMaximalSubparts) {
  // One U+FFFD per maximal invalid subpart, as Rust's from_utf8_lossy.
  EXPECT_EQ(Utf8Lossy("a\xE4\xBD"
                      "b"),
            "a\uFFFD"
            "b");
  EXPECT_EQ(Utf8Lossy("\xC0\x80"), "\uFFFD\uFFFD");
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x98"), "\uFFFD");
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x98\x80"), "\U0001F600");
  EXPECT_EQ(Utf8Lossy("\xE4\xBD\xE4\xBD\xA0"), "\uFFFD\u4F60");
}

TEST(Utf8Test, LossyHoldsBackIncompleteTail) {
  std::string out;
  EXPECT_EQ(AppendUtf8Lossy("ab\xF0\x9F", /*flush=*/false, &out), 2u);
  EXPECT_EQ(out, "ab");
  out.clear();
  // A tail that can no longer complete is not held back.
  EXPECT_EQ(AppendUtf8Lossy("ab\xF0\x41", /*flush=*/false, &out), 4u);
  EXPECT_EQ(out,
            "ab\uFFFD"
            "A");
}

TEST(NfcTest, ComposesAndReorders) {
  EXPECT_EQ(ToNfc("cafe\u0301"), "caf\u00E9");
  EXPECT_EQ(ToNfc("\u212B"), "\u00C5");        // singleton
  EXPECT_EQ(ToNfc("\u0958"), "\u0915\u093C");  // composition exclusion
  EXPECT_EQ(ToNfc("\u1E9B\u0323"), "\u1E9B\u0323");
  EXPECT_EQ(ToNfc("q\u0307\u0323"), "q\u0323\u0307");  // canonical order
  EXPECT_EQ(ToNfc("a\u0328\u0301"), "\u0105\u0301");   // blocked vs not
  EXPECT_EQ(ToNfc("\u1100\u1161\u11A8"), "\uAC01");    // Hangul LVT
  EXPECT_EQ(ToNfc("\uAC00\u11A8"), "\uAC01");          // Hangul LV + T
  EXPECT_EQ(ToNfc("\u0B47\u0B3E"), "\u0B4B");          // two starters
  EXPECT_EQ(ToNfd("\uAC01"), "\u1100\u1161\u11A8");
  EXPECT_EQ(ToNfd("\u00C5"), "A\u030A");
}

TEST(NfcTest, MarksNewerThanUnicode9AreStartersLikeHf) {
  // U+08D3 (Unicode 11) has class 220 today but is unknown to HF's normalizer.
  EXPECT_EQ(ToNfc("a\u08D3\u09BC"), "a\u08D3\u09BC");
  EXPECT_EQ(CombiningClass(0x08D3), 0);
  EXPECT_EQ(CombiningClass(0x0301), 230);
}

TEST(NfcTest, QuickCheck) {
  EXPECT_TRUE(IsNfcQuick("ASCII and \u00E9 and \u4F60\u597D"));
  EXPECT_FALSE(IsNfcQuick("e\u0301"));
  EXPECT_FALSE(IsNfcQuick("\u212B"));
  EXPECT_FALSE(IsNfcQuick("\u1100\u1161"));
}

TEST(UnicodeTest, CharacterClasses) {
  EXPECT_TRUE(IsWhiteSpace(0x3000));
  EXPECT_TRUE(IsWhiteSpace(0x85));
  EXPECT_FALSE(IsWhiteSpace(0x180E));
  EXPECT_FALSE(IsWhiteSpace(0x200B));
  EXPECT_TRUE(IsWordChar('_'));
  EXPECT_TRUE(IsWordChar(0x00E9));
  EXPECT_TRUE(IsWordChar(0x0301));  // marks are word characters
  EXPECT_TRUE(IsWordChar(0x200D));  // Join_Control
  EXPECT_FALSE(IsWordChar('-'));
  EXPECT_FALSE(IsWordChar(0x3000));
}

TEST(ByteLevelTest, RoundTripsEveryByte) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string mapped = BytesToByteLevel(all);
  EXPECT_TRUE(IsValidUtf8(mapped));
  std::string back;
  ASSERT_TRUE(ByteLevelToBytes(mapped, &back));
  EXPECT_EQ(back, all);
  EXPECT_EQ(BytesToByteLevel(" \n"), "\u0120\u010A");  // "Ġ" and "Ċ"
  back = "keep";
  EXPECT_FALSE(ByteLevelToBytes("a b", &back));  // ' ' is not in the alphabet
  EXPECT_EQ(back, "keep");
}

}  // namespace
}  // namespace specserve::tokenizer
