#include "scheduler/credentials.h"

#include <cstdio>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specserve::scheduler {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kAlice[] = "alice-token-0123456789";
constexpr char kBob[] = "bob-token-abcdefghijkl";
constexpr char kRoot[] = "root-token-ABCDEFGHIJ";

TEST(CredentialsTest, ParsesLinesCommentsAndBlanks) {
  const std::string text = std::string("# tenants of the test cluster\n\n") +
                           kAlice + " alice user\n" + "  \t\n" + "\t" + kBob +
                           "\tbob\tuser  \r\n" + "   # indented comment\n" +
                           kRoot + " ops admin";  // no final newline
  auto set = CredentialSet::Parse(text, "tokens.txt");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->size(), 3u);
  auto alice = set->Find(kAlice);
  ASSERT_TRUE(alice.has_value());
  EXPECT_EQ(alice->tenant, "alice");
  EXPECT_EQ(alice->role, Role::kUser);
  auto bob = set->Find(kBob);
  ASSERT_TRUE(bob.has_value());
  EXPECT_EQ(bob->tenant, "bob");
  auto root = set->Find(kRoot);
  ASSERT_TRUE(root.has_value());
  EXPECT_EQ(root->tenant, "ops");
  EXPECT_EQ(root->role, Role::kAdmin);
}

TEST(CredentialsTest, FindNeedsTheWholeToken) {
  auto set = CredentialSet::Parse(std::string(kAlice) + " alice user\n", "f");
  ASSERT_TRUE(set.ok());
  EXPECT_FALSE(set->Find("").has_value());
  EXPECT_FALSE(set->Find("alice-token").has_value());  // a prefix
  EXPECT_FALSE(set->Find(std::string(kAlice) + "x").has_value());
  EXPECT_FALSE(set->Find("ALICE-TOKEN-0123456789").has_value());
  EXPECT_FALSE(set->Find("alice").has_value());  // the tenant is no token
  EXPECT_TRUE(set->Find(kAlice).has_value());
}

TEST(CredentialsTest, SeveralTokensOfOneTenant) {
  auto set = CredentialSet::Parse(
      std::string(kAlice) + " alice user\n" + kBob + " alice admin\n", "f");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->Find(kAlice)->tenant, "alice");
  EXPECT_EQ(set->Find(kBob)->tenant, "alice");
  EXPECT_EQ(set->Find(kBob)->role, Role::kAdmin);
}

// Each malformed line fails the file, naming the file and the line, never
// the token.
TEST(CredentialsTest, MalformedLinesNameTheLine) {
  struct Case {
    std::string line;
    std::string why;
  };
  const Case cases[] = {
      {std::string(kAlice) + " alice", "expected 'TOKEN TENANT ROLE', got 2"},
      {std::string(kAlice) + " alice user extra", "got 4 field(s)"},
      {std::string(kAlice) + " alice root", "role must be 'user' or 'admin'"},
      {std::string(kAlice) + " alice User", "role must be 'user' or 'admin'"},
      {"short alice user", "shorter than 16 characters"},
      {std::string(kAlice) + " al/ice user", "the tenant must be"},
      {std::string(kAlice) + " " + std::string(129, 't') + " user",
       "the tenant must be"},
      {std::string("tok\x01") + "en-0123456789abc alice user", "visible ASCII"},
  };
  for (const Case& c : cases) {
    const std::string text = "# header\n" + std::string(kBob) +
                             " bob user\n\n" + c.line + "\n" + kRoot +
                             " ops admin\n";
    auto set = CredentialSet::Parse(text, "tokens.txt");
    ASSERT_FALSE(set.ok()) << c.line;
    EXPECT_EQ(set.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(set.status().message());
    EXPECT_THAT(message, HasSubstr("tokens.txt line 4: ")) << c.line;
    EXPECT_THAT(message, HasSubstr(c.why)) << c.line;
    EXPECT_THAT(message, Not(HasSubstr(kAlice)));
    EXPECT_THAT(message, Not(HasSubstr(kBob)));
  }
}

TEST(CredentialsTest, TheSameTokenTwiceFails) {
  auto set = CredentialSet::Parse(
      std::string(kAlice) + " alice user\n" + kAlice + " bob user\n", "f");
  ASSERT_FALSE(set.ok());
  EXPECT_THAT(std::string(set.status().message()),
              HasSubstr("f line 2: the token of line 1 again"));
}

TEST(CredentialsTest, AFileWithNoCredentialFails) {
  for (const std::string text : {"", "\n\n", "# only comments\n  # more\n"}) {
    auto set = CredentialSet::Parse(text, "empty.txt");
    ASSERT_FALSE(set.ok()) << text;
    EXPECT_THAT(std::string(set.status().message()),
                HasSubstr("empty.txt holds no credential"));
  }
}

TEST(CredentialsTest, LoadReadsAFile) {
  const std::string path =
      std::string(testing::TempDir()) + "/credentials_test_tokens.txt";
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fprintf(f, "%s alice user\n", kAlice);
  std::fclose(f);
  auto set = CredentialSet::Load(path);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->Find(kAlice)->tenant, "alice");
  std::remove(path.c_str());
  auto gone = CredentialSet::Load(path);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(gone.status().message()),
              HasSubstr("cannot read " + path));
}

TEST(CredentialsTest, RoleNames) {
  EXPECT_EQ(RoleName(Role::kUser), "user");
  EXPECT_EQ(RoleName(Role::kAdmin), "admin");
  EXPECT_EQ(Caller::Anonymous().tenant, "");
  EXPECT_EQ(Caller::Anonymous().role, Role::kAdmin);
}

}  // namespace
}  // namespace specserve::scheduler
