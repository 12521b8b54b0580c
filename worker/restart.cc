#include "worker/restart.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace specserve::worker {
namespace {

// Whether `arg` is flag `name` ("--name", "-name", with or without "=value");
// *takes_next when the value is the next argument.
bool IsFlag(const std::string& arg, const std::string& name, bool* takes_next) {
  for (const char* dashes : {"--", "-"}) {
    const std::string bare = absl::StrCat(dashes, name);
    if (arg == bare) {
      *takes_next = true;
      return true;
    }
    if (absl::StartsWith(arg, bare + "=")) {
      *takes_next = false;
      return true;
    }
  }
  return false;
}

}  // namespace

std::vector<std::string> RestartArgs(const std::vector<std::string>& args,
                                     const std::string& model_dir,
                                     const std::string& listen) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    bool takes_next = false;
    if (i > 0 && (IsFlag(args[i], "model", &takes_next) ||
                  IsFlag(args[i], "listen", &takes_next))) {
      if (takes_next) ++i;  // skip its value
      continue;
    }
    out.push_back(args[i]);
  }
  out.push_back("--model=" + model_dir);
  out.push_back("--listen=" + listen);
  return out;
}

absl::Status ExecSelf(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& a : args)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(nullptr);
  ::execv("/proc/self/exe", argv.data());
  return absl::InternalError(
      absl::StrCat("cannot restart: execv: ", std::strerror(errno)));
}

}  // namespace specserve::worker
