#include "worker/restart.h"

#include "gtest/gtest.h"

namespace specserve::worker {
namespace {

TEST(RestartArgs, ReplacesModelAndListenInEveryForm) {
  const std::vector<std::string> args = {
      "specserve_worker",    "--model",     "models/a",       "--device=cpu",
      "-listen=127.0.0.1:0", "--threads=1", "-model=models/b"};
  EXPECT_EQ(RestartArgs(args, "models/new", "127.0.0.1:5050"),
            (std::vector<std::string>{"specserve_worker", "--device=cpu",
                                      "--threads=1", "--model=models/new",
                                      "--listen=127.0.0.1:5050"}));
}

TEST(RestartArgs, KeepsOtherFlagsThatOnlyStartAlike) {
  const std::vector<std::string> args = {"w", "--modelx=1",
                                         "--listen_backlog=3"};
  EXPECT_EQ(RestartArgs(args, "m", "h:1"),
            (std::vector<std::string>{"w", "--modelx=1", "--listen_backlog=3",
                                      "--model=m", "--listen=h:1"}));
}

}  // namespace
}  // namespace specserve::worker
