// Restarting the worker process on another model (Worker.LoadModel): the
// same binary and flags, with --model and --listen replaced, so the process
// comes back on the same port and the scheduler reconnects by its health
// polling.
#ifndef SPECSERVE_WORKER_RESTART_H_
#define SPECSERVE_WORKER_RESTART_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace specserve::worker {

// argv for the restart: `args` (argv[0] first) without any --model/-model
// or --listen/-listen flag (either "=value" or a separate value), then
// --model=model_dir and --listen=listen.
std::vector<std::string> RestartArgs(const std::vector<std::string>& args,
                                     const std::string& model_dir,
                                     const std::string& listen);

// Replaces this process with /proc/self/exe run on `args` (execv). Returns
// only on failure.
absl::Status ExecSelf(const std::vector<std::string>& args);

}  // namespace specserve::worker

#endif  // SPECSERVE_WORKER_RESTART_H_
