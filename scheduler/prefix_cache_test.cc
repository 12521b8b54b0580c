// The prefix radix tree: longest match, divergence in the middle of a
// history, re-recording, eviction order and limits, tenant isolation.
#include "scheduler/prefix_cache.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace specserve::scheduler {
namespace {

PrefixSource Src(const std::string& id, int worker = 0, bool owned = false) {
  return PrefixSource{id, "t", worker, owned};
}

std::vector<uint32_t> Range(uint32_t from, uint32_t to) {
  std::vector<uint32_t> v;
  for (uint32_t i = from; i < to; ++i) v.push_back(i);
  return v;
}

// (session, pos) of each hit, in order.
std::vector<std::pair<std::string, uint32_t>> Hits(
    const PrefixCache& c, const std::string& tenant,
    const std::vector<uint32_t>& prompt, size_t max = 10) {
  std::vector<std::pair<std::string, uint32_t>> out;
  for (const PrefixHit& h : c.Lookup(tenant, prompt, max)) {
    out.emplace_back(h.source.session_id, h.pos);
  }
  return out;
}

using Hit = std::pair<std::string, uint32_t>;

TEST(PrefixCacheTest, LongestRecordedPrefixFirst) {
  PrefixCache c;
  const std::vector<uint32_t> h = Range(0, 20);  // prompt 0..9, reply 10..19
  c.Record("a", Src("s1"), h, {10, 20});
  // The whole history and more: the committed end, then the checkpoint.
  std::vector<uint32_t> longer = Range(0, 25);
  EXPECT_EQ(Hits(c, "a", longer), (std::vector<Hit>{{"s1", 20}, {"s1", 10}}));
  // Exactly the history: a full match counts.
  EXPECT_EQ(Hits(c, "a", h), (std::vector<Hit>{{"s1", 20}, {"s1", 10}}));
  // Shorter than every entry: nothing.
  EXPECT_TRUE(Hits(c, "a", Range(0, 9)).empty());
  EXPECT_EQ(Hits(c, "a", longer, 1), (std::vector<Hit>{{"s1", 20}}));
}

TEST(PrefixCacheTest, DivergenceMidHistoryFallsBackToTheEarlierEntry) {
  PrefixCache c;
  c.Record("a", Src("s1"), Range(0, 20), {10, 20});
  // Diverges inside the reply (token 15): only the prompt checkpoint.
  std::vector<uint32_t> p = Range(0, 15);
  p.push_back(999);
  EXPECT_EQ(Hits(c, "a", p), (std::vector<Hit>{{"s1", 10}}));
  // Diverges inside the prompt: nothing.
  std::vector<uint32_t> q = Range(0, 5);
  q.push_back(999);
  EXPECT_TRUE(Hits(c, "a", q).empty());
  // A second history splitting the first one's edge keeps both findable.
  std::vector<uint32_t> other = Range(0, 12);
  other.push_back(500);
  c.Record("a", Src("s2"), other, {13});
  std::vector<uint32_t> p2 = other;
  p2.push_back(7);
  EXPECT_EQ(Hits(c, "a", p2), (std::vector<Hit>{{"s2", 13}, {"s1", 10}}));
  EXPECT_EQ(Hits(c, "a", Range(0, 21)),
            (std::vector<Hit>{{"s1", 20}, {"s1", 10}}));
}

TEST(PrefixCacheTest, RecordReplacesASessionsPositions) {
  PrefixCache c;
  c.Record("a", Src("s1"), Range(0, 20), {10, 20});
  // The session took another turn: its old end is no longer reusable.
  std::vector<uint32_t> next = Range(0, 20);
  next.push_back(77);
  next.push_back(78);
  c.Record("a", Src("s1", 1), next, {21, 22});
  EXPECT_EQ(Hits(c, "a", next), (std::vector<Hit>{{"s1", 22}, {"s1", 21}}));
  EXPECT_TRUE(Hits(c, "a", Range(0, 20)).empty());
  EXPECT_EQ(c.Lookup("a", next, 1)[0].source.worker, 1);
  EXPECT_EQ(c.sessions(), 1u);
}

TEST(PrefixCacheTest, ForgetPrunesAndMostRecentFirstAmongEquals) {
  PrefixCache c;
  c.Record("a", Src("s1"), Range(0, 8), {8});
  c.Record("a", Src("s2"), Range(0, 8), {8});
  EXPECT_EQ(Hits(c, "a", Range(0, 9)),
            (std::vector<Hit>{{"s2", 8}, {"s1", 8}}));
  c.Touch("s1");
  EXPECT_EQ(Hits(c, "a", Range(0, 9)),
            (std::vector<Hit>{{"s1", 8}, {"s2", 8}}));
  EXPECT_EQ(c.Forget("s1").session_id, "s1");
  EXPECT_EQ(Hits(c, "a", Range(0, 9)), (std::vector<Hit>{{"s2", 8}}));
  EXPECT_TRUE(c.Forget("s1").session_id.empty());
  c.Forget("s2");
  EXPECT_TRUE(Hits(c, "a", Range(0, 9)).empty());
  EXPECT_EQ(c.sessions(), 0u);
}

TEST(PrefixCacheTest, EvictsLeastRecentlyUsedAndReturnsOwnedOnes) {
  PrefixCache c({.max_sessions = 3, .max_owned = 2});
  EXPECT_TRUE(c.Record("a", Src("o1", 0, true), Range(0, 5), {5}).empty());
  EXPECT_TRUE(c.Record("a", Src("o2", 0, true), Range(10, 15), {5}).empty());
  c.Touch("o1");  // o2 is now the oldest owned one
  std::vector<PrefixSource> out =
      c.Record("a", Src("o3", 0, true), Range(20, 25), {5});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].session_id, "o2");
  EXPECT_TRUE(Hits(c, "a", Range(10, 15)).empty());
  EXPECT_EQ(c.owned(), 2u);
  // Not owned: counts toward max_sessions only, and is evicted silently.
  c.Record("a", Src("s1"), Range(30, 35), {5});
  EXPECT_EQ(c.sessions(), 3u);
  out = c.Record("a", Src("s2"), Range(40, 45), {5});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].session_id, "o1");  // the least recently used
  out = c.Record("a", Src("s3"), Range(50, 55), {5});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].session_id, "o3");
  out = c.Record("a", Src("s4"), Range(60, 65), {5});
  EXPECT_TRUE(out.empty());  // s1 went, not owned
  EXPECT_TRUE(Hits(c, "a", Range(30, 35)).empty());
  EXPECT_EQ(Hits(c, "a", Range(60, 66)), (std::vector<Hit>{{"s4", 5}}));
  EXPECT_EQ(c.sessions(), 3u);
  EXPECT_EQ(c.owned(), 0u);
}

TEST(PrefixCacheTest, TenantsNeverSeeEachOthersEntries) {
  PrefixCache c;
  c.Record("alice", Src("s1"), Range(0, 10), {10});
  EXPECT_TRUE(Hits(c, "bob", Range(0, 12)).empty());
  EXPECT_TRUE(Hits(c, "", Range(0, 12)).empty());
  EXPECT_EQ(Hits(c, "alice", Range(0, 12)), (std::vector<Hit>{{"s1", 10}}));
  c.Record("bob", Src("s2"), Range(0, 10), {10});
  EXPECT_EQ(Hits(c, "bob", Range(0, 12)), (std::vector<Hit>{{"s2", 10}}));
  EXPECT_EQ(Hits(c, "alice", Range(0, 12)), (std::vector<Hit>{{"s1", 10}}));
}

TEST(PrefixCacheTest, IgnoresPositionsOutsideTheHistory) {
  PrefixCache c;
  c.Record("a", Src("s1"), Range(0, 4), {0, 4, 9});
  EXPECT_EQ(Hits(c, "a", Range(0, 10)), (std::vector<Hit>{{"s1", 4}}));
  std::vector<PrefixSource> owned = c.Clear();
  EXPECT_TRUE(owned.empty());
  EXPECT_TRUE(Hits(c, "a", Range(0, 10)).empty());
}

}  // namespace
}  // namespace specserve::scheduler
