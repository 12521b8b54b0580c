// What a client is shown of the committed tokens: stop tokens (hidden, or
// shown as an id with include_stop_token), stop strings (not looked for in
// the first min_tokens tokens' text), and what ended the output.
#include "scheduler/output_stream.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler/tokenizer/tokenizer.h"

namespace specserve::scheduler {
namespace {

constexpr char kTokenizer[] = "tests/tokenizer/data/qwen2_style/tokenizer.json";

class OutputStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = tokenizer::Tokenizer::Load(kTokenizer);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = std::move(tok).value();
  }
  std::vector<uint32_t> Ids(const std::string& text) {
    return tok_->Encode(text, /*parse_special=*/false);
  }
  // Feeds `ids` one at a time; returns the ids and text shown.
  std::pair<std::vector<uint32_t>, std::string> Run(
      OutputStream* out, const std::vector<uint32_t>& ids) {
    std::vector<uint32_t> shown;
    std::string text;
    for (uint32_t id : ids) {
      absl::StatusOr<specserve::v1::TokenDelta> d = out->Feed({id});
      EXPECT_TRUE(d.ok()) << d.status();
      shown.insert(shown.end(), d->ids().begin(), d->ids().end());
      text += d->text();
    }
    text += out->Finish().text();
    return {shown, text};
  }
  std::unique_ptr<tokenizer::Tokenizer> tok_;
};

TEST_F(OutputStreamTest, StopTokenHiddenUnlessAskedAndNamed) {
  const std::vector<uint32_t> ids = Ids("one two three four");
  ASSERT_GE(ids.size(), 4u);
  const uint32_t stop = ids[2];
  for (bool show : {false, true}) {
    OutputOptions o;
    o.want_text = true;
    o.want_ids = true;
    o.stop_ids = {stop};
    o.show_stop_token = show;
    OutputStream out(tok_.get(), o);
    auto [shown, text] = Run(&out, ids);
    std::vector<uint32_t> want(ids.begin(), ids.begin() + 2);
    if (show) want.push_back(stop);  // its id, never its text
    EXPECT_EQ(shown, want);
    EXPECT_EQ(text, *tok_->Decode({ids[0], ids[1]}, true));
    EXPECT_EQ(out.shown_tokens(), want.size());
    EXPECT_TRUE(out.stopped());
    EXPECT_EQ(out.matched_token(), stop);
    EXPECT_FALSE(out.matched_string().has_value());
  }
}

TEST_F(OutputStreamTest, StopStringNamedAndNotLookedForBeforeMinTokens) {
  const std::vector<uint32_t> ids = Ids("a, b, c, d");
  OutputOptions o;
  o.want_text = true;
  o.stop_strings = {","};
  {
    OutputStream out(tok_.get(), o);
    auto [shown, text] = Run(&out, ids);
    EXPECT_EQ(text, "a");
    EXPECT_EQ(out.matched_string(), ",");
    EXPECT_FALSE(out.matched_token().has_value());
  }
  // min_tokens up to the token holding the first comma: the second stops.
  size_t comma = 0;
  while (tok_->Decode(absl::MakeConstSpan(ids.data(), comma + 1), true)
             ->find(',') == std::string::npos) {
    ++comma;
  }
  o.min_tokens = comma + 1;
  OutputStream out(tok_.get(), o);
  auto [shown, text] = Run(&out, ids);
  EXPECT_EQ(text, "a, b");
  EXPECT_EQ(out.matched_string(), ",");
}

TEST_F(OutputStreamTest, NothingMatchedWithoutAStop) {
  OutputOptions o;
  o.want_ids = true;
  o.stop_ids = {999999};
  o.stop_strings = {"zzz"};
  OutputStream out(tok_.get(), o);
  const std::vector<uint32_t> ids = Ids("plain text");
  EXPECT_EQ(Run(&out, ids).first, ids);
  EXPECT_FALSE(out.stopped());
  EXPECT_FALSE(out.matched_token().has_value());
  EXPECT_FALSE(out.matched_string().has_value());
}

}  // namespace
}  // namespace specserve::scheduler
