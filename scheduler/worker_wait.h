// Waiting for a worker when none is available (docs/RELIABILITY.md row 16).
//
// A request that finds no available worker (the scheduler started before its
// workers listen, the only worker restarts or was frozen for a moment) waits
// for one instead of failing at once: up to SchedulerOptions::no_worker_wait
// (--no_worker_wait_ms) and never past its own deadline. Past the bound it
// fails UNAVAILABLE naming each worker's last known state, so the caller
// knows whether to retry or to look at the workers.
//
// The wait polls gRPC (a completion queue's AsyncNext, every 20 ms), so a
// thread that waits inside an IdlePoller::StreamingScope keeps the invariant
// of scheduler/idle_poller.h.
#ifndef SPECSERVE_SCHEDULER_WORKER_WAIT_H_
#define SPECSERVE_SCHEDULER_WORKER_WAIT_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "scheduler/scheduler_context.h"

namespace specserve::scheduler {

// Returns OK as soon as a worker is available and has reported its model
// (ctx->CurrentLimits holds), at once if one is now. Otherwise waits until
// min(`deadline`, now + no_worker_wait): DEADLINE_EXCEEDED when the deadline
// ends the wait, UNAVAILABLE when the bound does, or the status `stopped()`
// returns as soon as it is not OK (the client cancelled, the server drains).
absl::Status AwaitWorker(const SchedulerContext& ctx, absl::Time deadline,
                         const std::function<absl::Status()>& stopped);

// The UNAVAILABLE status of a request that found no worker after waiting
// `waited`: each worker's address and why it is unavailable.
absl::Status NoWorkerError(const WorkerPool& pool, absl::Duration waited);

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_WORKER_WAIT_H_
