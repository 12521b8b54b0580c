#include "scheduler/request_registry.h"

#include "gtest/gtest.h"

namespace specserve::scheduler {
namespace {

TEST(RequestRegistryTest, IdsArePerTenant) {
  RequestRegistry r;
  RequestRegistry::CancelFlag alice = r.Register("alice", "req-1");
  ASSERT_NE(alice, nullptr);
  // The same id in another tenant is another request; in the same tenant it
  // is refused while the first runs.
  RequestRegistry::CancelFlag bob = r.Register("bob", "req-1");
  ASSERT_NE(bob, nullptr);
  EXPECT_EQ(r.Register("alice", "req-1"), nullptr);
  EXPECT_EQ(r.size(), 2);

  // Bob's abort reaches his own request only.
  EXPECT_EQ(r.AbortRequest("bob", "req-1"), 1);
  EXPECT_TRUE(bob->load());
  EXPECT_FALSE(alice->load());
  EXPECT_EQ(r.AbortRequest("bob", "req-2"), 0);
  EXPECT_EQ(r.AbortRequest("carol", "req-1"), 0);
  EXPECT_FALSE(alice->load());

  r.Unregister("alice", "req-1");
  EXPECT_NE(r.Register("alice", "req-1"), nullptr);
}

TEST(RequestRegistryTest, AbortSessionStaysInItsTenant) {
  RequestRegistry r;
  RequestRegistry::CancelFlag a = r.Register("alice", "a");
  RequestRegistry::CancelFlag b = r.Register("bob", "b");
  r.SetSession("alice", "a", "ses_1");
  // A request naming someone else's session (it fails NOT_FOUND once it
  // runs) is not reached by that session's owner, nor reaches it.
  r.SetSession("bob", "b", "ses_1");
  EXPECT_EQ(r.AbortSession("alice", "ses_1"), 1);
  EXPECT_TRUE(a->load());
  EXPECT_FALSE(b->load());
  EXPECT_EQ(r.AbortAll(), 2);
  EXPECT_TRUE(b->load());
}

}  // namespace
}  // namespace specserve::scheduler
