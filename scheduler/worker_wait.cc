#include "scheduler/worker_wait.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"

namespace specserve::scheduler {
namespace {

// How often a waiting request looks at the pool again.
constexpr absl::Duration kRecheck = absl::Milliseconds(20);

bool HasWorker(const SchedulerContext& ctx) {
  Limits limits;
  return ctx.CurrentLimits(&limits);
}

}  // namespace

absl::Status NoWorkerError(const WorkerPool& pool, absl::Duration waited) {
  std::string why;
  for (const specserve::v1::WorkerStatus& w : pool.Snapshot()) {
    absl::StrAppend(&why, why.empty() ? "" : "; ", w.address(), ": ",
                    w.available() ? "no model reported yet" : w.detail());
  }
  return absl::UnavailableError(absl::StrCat(
      "no worker available after waiting ",
      absl::FormatDuration(absl::Trunc(waited, absl::Milliseconds(1))),
      " (--no_worker_wait_ms) for one of the ", pool.size(),
      " worker(s) to pass its health checks (", why,
      "); retry later, and see Admin.GetServerInfo for each worker"));
}

absl::Status AwaitWorker(const SchedulerContext& ctx, absl::Time deadline,
                         const std::function<absl::Status()>& stopped) {
  if (HasWorker(ctx)) return absl::OkStatus();
  const absl::Time start = absl::Now();
  const absl::Time until =
      std::min(deadline, start + ctx.options.no_worker_wait);
  // Waiting on a queue of its own polls gRPC (see the header); nothing is
  // ever posted to it.
  grpc::CompletionQueue cq;
  absl::Status result;
  while (true) {
    result = stopped();
    if (!result.ok() || HasWorker(ctx)) break;
    const absl::Time now = absl::Now();
    if (now >= until) {
      result = NoWorkerError(*ctx.workers, now - start);
      if (now >= deadline) {
        result = absl::DeadlineExceededError(
            absl::StrCat("the deadline passed while waiting for a worker: ",
                         result.message()));
      }
      break;
    }
    void* tag = nullptr;
    bool ok = false;
    cq.AsyncNext(&tag, &ok,
                 absl::ToChronoTime(std::min(until, now + kRecheck)));
  }
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  return result;
}

}  // namespace specserve::scheduler
