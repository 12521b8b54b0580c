#include "scheduler/stop_strings.h"

#include <random>
#include <string>
#include <vector>

#include "google/protobuf/repeated_ptr_field.h"
#include "gtest/gtest.h"

namespace specserve::scheduler {
namespace {

using Stops = std::vector<std::string>;

// Feeds the deltas and returns everything emitted (Flush included when no
// stop was hit).
std::string Run(StopStringMatcher& m, const std::vector<std::string>& deltas) {
  std::string out;
  for (const std::string& d : deltas) {
    auto r = m.Feed(d);
    out += r.emit;
    if (r.stopped) return out;
  }
  return out + m.Flush();
}

TEST(StopStringsTest, NoStopsPassesThrough) {
  StopStringMatcher m(Stops{});
  EXPECT_TRUE(m.empty());
  auto r = m.Feed("hello");
  EXPECT_EQ(r.emit, "hello");
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopStringsTest, StopInsideOneDelta) {
  StopStringMatcher m(Stops{"STOP"});
  auto r = m.Feed("hello STOP world");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emit, "hello ");
  EXPECT_EQ(r.matched, "STOP");
  EXPECT_TRUE(m.stopped());
  // After a stop nothing more comes out.
  auto after = m.Feed("more");
  EXPECT_TRUE(after.stopped);
  EXPECT_EQ(after.emit, "");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopStringsTest, StopSpanningDeltasIsHeldBack) {
  StopStringMatcher m(Stops{"STOP"});
  auto r1 = m.Feed("hel");
  EXPECT_EQ(r1.emit, "hel");
  auto r2 = m.Feed("lo ST");
  EXPECT_EQ(r2.emit, "lo ");  // "ST" could start "STOP"
  EXPECT_EQ(m.held(), 2u);
  auto r3 = m.Feed("O");
  EXPECT_EQ(r3.emit, "");
  EXPECT_FALSE(r3.stopped);
  auto r4 = m.Feed("P and more");
  EXPECT_TRUE(r4.stopped);
  EXPECT_EQ(r4.emit, "");
}

TEST(StopStringsTest, FalseAlarmIsReleased) {
  StopStringMatcher m(Stops{"STOP"});
  EXPECT_EQ(m.Feed("a ST").emit, "a ");
  auto r = m.Feed("ART");
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(r.emit, "START");
  EXPECT_EQ(m.held(), 0u);
}

TEST(StopStringsTest, FlushReleasesHeldText) {
  StopStringMatcher m(Stops{"</end>"});
  EXPECT_EQ(m.Feed("done </e").emit, "done ");
  EXPECT_EQ(m.Flush(), "</e");
}

TEST(StopStringsTest, FirstStopToCompleteWins) {
  StopStringMatcher m(Stops{"world", "lo w"});
  auto r = m.Feed("hello world");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emit, "hel");
  EXPECT_EQ(r.matched, "lo w");
  // "acac" starts before "c" but would complete later: "c" wins, whether or
  // not the text arrives in one piece.
  StopStringMatcher whole(Stops{"c", "acac"});
  EXPECT_EQ(whole.Feed("aacac").emit, "aa");
  StopStringMatcher split(Stops{"c", "acac"});
  EXPECT_EQ(split.Feed("aa").emit, "a");
  auto r2 = split.Feed("cac");
  EXPECT_TRUE(r2.stopped);
  EXPECT_EQ(r2.emit, "a");
  EXPECT_EQ(r2.matched, "c");
}

TEST(StopStringsTest, SameEndPrefersLongest) {
  StopStringMatcher m(Stops{"bc", "abc"});
  auto r = m.Feed("xabc");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emit, "x");
  EXPECT_EQ(r.matched, "abc");
}

TEST(StopStringsTest, OverlappingPrefixesOfDifferentStops) {
  StopStringMatcher m(Stops{"abcd", "bce"});
  // "ab" may start "abcd" (and "b" may start "bce"): hold the longer.
  EXPECT_EQ(m.Feed("xab").emit, "x");
  EXPECT_EQ(m.held(), 2u);
  auto r = m.Feed("ce");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.matched, "bce");
  EXPECT_EQ(r.emit, "a");
}

TEST(StopStringsTest, SelfOverlappingStop) {
  StopStringMatcher m(Stops{"aab"});
  std::string out;
  for (char c : std::string("aaab")) {
    auto r = m.Feed(std::string(1, c));
    out += r.emit;
    if (r.stopped) break;
  }
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(out, "a");
}

TEST(StopStringsTest, EmptyStopStringsAreIgnored) {
  StopStringMatcher m(Stops{"", "x"});
  auto r = m.Feed("abc");
  EXPECT_EQ(r.emit, "abc");
  EXPECT_FALSE(r.stopped);
}

TEST(StopStringsTest, HoldBackKeepsUtf8CharactersWhole) {
  // "é" is C3 A9; the stop "é!" starts with it.
  StopStringMatcher m(Stops{"\xC3\xA9!"});
  EXPECT_EQ(m.Feed("caf\xC3\xA9").emit, "caf");
  EXPECT_EQ(m.Feed("?").emit, "\xC3\xA9?");
  auto r = m.Feed(" \xC3\xA9!");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emit, " ");
}

TEST(StopStringsTest, WorksWithProtoRepeatedField) {
  google::protobuf::RepeatedPtrField<std::string> stops;
  *stops.Add() = "\n\n";
  StopStringMatcher m(stops);
  auto r = m.Feed("para\n\nnext");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emit, "para");
}

// Property: for any split of the text into deltas, the emitted text equals the
// text up to the first stop string to complete (or all of it), and nothing is
// emitted that a later delta could turn into a stop string.
TEST(StopStringsTest, RandomSplitsMatchReference) {
  std::mt19937 rng(1234);
  const std::string alphabet = "abc";
  for (int trial = 0; trial < 2000; ++trial) {
    Stops stops;
    const int n_stops = 1 + rng() % 3;
    for (int i = 0; i < n_stops; ++i) {
      std::string s;
      const int len = 1 + rng() % 4;
      for (int j = 0; j < len; ++j) s += alphabet[rng() % alphabet.size()];
      stops.push_back(s);
    }
    std::string text;
    const int text_len = rng() % 20;
    for (int j = 0; j < text_len; ++j)
      text += alphabet[rng() % alphabet.size()];

    // Reference: scan ends left to right; the first end where some stop
    // string matches cuts the text before the longest such stop.
    size_t cut = text.size();
    bool expect_stop = false;
    for (size_t end = 1; end <= text.size() && !expect_stop; ++end) {
      for (const std::string& s : stops) {
        if (s.size() <= end && text.compare(end - s.size(), s.size(), s) == 0) {
          expect_stop = true;
          cut = std::min(cut, end - s.size());
        }
      }
    }
    const std::string expected = text.substr(0, cut);

    std::vector<std::string> deltas;
    for (size_t pos = 0; pos < text.size();) {
      const size_t len = 1 + rng() % 4;
      deltas.push_back(text.substr(pos, len));
      pos += len;
    }
    StopStringMatcher m(stops);
    std::string emitted;
    for (const std::string& d : deltas) {
      auto r = m.Feed(d);
      emitted += r.emit;
      // Everything emitted so far is a prefix of the expected output.
      ASSERT_EQ(expected.compare(0, emitted.size(), emitted), 0)
          << "text=" << text << " emitted=" << emitted;
      if (r.stopped) break;
    }
    emitted += m.Flush();
    EXPECT_EQ(emitted, expected) << "text=" << text;
    EXPECT_EQ(m.stopped(), expect_stop) << "text=" << text;
  }
}

}  // namespace
}  // namespace specserve::scheduler
