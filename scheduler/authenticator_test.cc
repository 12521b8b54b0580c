#include "scheduler/authenticator.h"

#include <cstdio>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specserve::scheduler {
namespace {

using ::testing::HasSubstr;

constexpr char kAlice[] = "alice-token-0123456789";
constexpr char kRoot[] = "root-token-ABCDEFGHIJ";
constexpr char kNew[] = "new-token-zyxwvutsrqpo";

class AuthenticatorTest : public ::testing::Test {
 protected:
  void Write(const std::string& text) {
    std::FILE* f = std::fopen(path_.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
  void TearDown() override { std::remove(path_.c_str()); }

  // What a call with these metadata values (key "authorization") gets.
  absl::StatusOr<Caller> Call(const Authenticator& auth,
                              const std::vector<std::string>& values) {
    CallMetadata md;
    md.emplace("x-other", "1");
    for (const std::string& v : values) md.emplace(kAuthorizationMetadata, v);
    return auth.Authenticate(md);
  }

  const std::string path_ =
      std::string(testing::TempDir()) + "/authenticator_test_tokens.txt";
};

TEST_F(AuthenticatorTest, OffMeansOneAnonymousAdmin) {
  Authenticator auth;
  EXPECT_FALSE(auth.enabled());
  auto caller = Call(auth, {});
  ASSERT_TRUE(caller.ok());
  EXPECT_EQ(caller->tenant, "");
  EXPECT_EQ(caller->role, Role::kAdmin);
  EXPECT_EQ(auth.Reload().status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(AuthenticatorTest, BearerTokens) {
  Write(std::string(kAlice) + " alice user\n" + kRoot + " ops admin\n");
  Authenticator auth;
  ASSERT_TRUE(auth.Load(path_).ok());
  EXPECT_TRUE(auth.enabled());

  auto alice = Call(auth, {std::string("Bearer ") + kAlice});
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(alice->tenant, "alice");
  EXPECT_EQ(alice->role, Role::kUser);
  // The scheme is case-insensitive.
  auto root = Call(auth, {std::string("bearer ") + kRoot});
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_EQ(root->role, Role::kAdmin);

  struct Case {
    std::vector<std::string> values;
    std::string why;
  };
  const Case refused[] = {
      {{}, "missing credentials"},
      {{kAlice}, "must be 'Bearer TOKEN'"},
      {{std::string("Basic ") + kAlice}, "must be 'Bearer TOKEN'"},
      {{"Bearer "}, "empty bearer token"},
      {{"Bearer wrong-token-0123456789"}, "invalid bearer token"},
      {{std::string("Bearer ") + kAlice + "x"}, "invalid bearer token"},
      {{std::string("Bearer ") + kAlice, std::string("Bearer ") + kRoot},
       "more than one"},
  };
  for (const Case& c : refused) {
    auto got = Call(auth, c.values);
    ASSERT_FALSE(got.ok()) << c.why;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(c.why));
  }
}

TEST_F(AuthenticatorTest, ReloadSwapsTheSetOrKeepsIt) {
  Write(std::string(kAlice) + " alice user\n");
  Authenticator auth;
  ASSERT_TRUE(auth.Load(path_).ok());
  EXPECT_FALSE(Call(auth, {std::string("Bearer ") + kNew}).ok());

  // A token added works after the reload; one removed is refused.
  Write(std::string(kNew) + " alice user\n");
  auto n = auth.Reload();
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1u);
  EXPECT_TRUE(Call(auth, {std::string("Bearer ") + kNew}).ok());
  EXPECT_FALSE(Call(auth, {std::string("Bearer ") + kAlice}).ok());

  // A file that does not parse keeps the credentials in force.
  Write(std::string(kAlice) + " alice superuser\n");
  auto bad = auth.Reload();
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("line 1"));
  EXPECT_TRUE(Call(auth, {std::string("Bearer ") + kNew}).ok());
  EXPECT_FALSE(Call(auth, {std::string("Bearer ") + kAlice}).ok());
  std::remove(path_.c_str());
  EXPECT_FALSE(auth.Reload().ok());
  EXPECT_TRUE(Call(auth, {std::string("Bearer ") + kNew}).ok());
}

TEST_F(AuthenticatorTest, LoadFailsOnABadFile) {
  Write("# nothing\n" + std::string(kAlice) + " alice\n");
  Authenticator auth;
  absl::Status s = auth.Load(path_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr(path_ + " line 2"));
  EXPECT_FALSE(auth.enabled());
}

TEST(RequireAdminTest, RolesDecide) {
  EXPECT_TRUE(RequireAdmin(Caller{"ops", Role::kAdmin}, "Admin.Drain").ok());
  EXPECT_TRUE(RequireAdmin(Caller::Anonymous(), "Admin.Drain").ok());
  absl::Status s = RequireAdmin(Caller{"alice", Role::kUser}, "Admin.Drain");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(),
            "Admin.Drain needs role admin; this token has role user");
}

}  // namespace
}  // namespace specserve::scheduler
