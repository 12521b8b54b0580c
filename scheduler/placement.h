// Where a session's next turn runs: a pure function over snapshots of the
// session's residency and the workers' loads, so the policy is tested with
// made-up loads and the caller does all the I/O.
//
// Rules:
// - A session resident on a worker (ACTIVE, PARKED, OFFLOADED) stays there
//   while that worker is available: its caches are there.
// - A NEW or LOST session, or one whose worker is no longer available, goes to
//   the least-loaded available worker and is (re)built there by a prefill of
//   its history (`rebuild` = true).
// - Least loaded = lowest score, score = memory_used / memory_budget +
//   burst_weight × active_bursts; ties go to fewer sessions, then the lower
//   index (deterministic). Workers at or above `full_fraction` of their budget
//   are skipped while any other is available.
// - No available worker: UNAVAILABLE "no worker available". A CLOSED session
//   is never placed: FAILED_PRECONDITION (a caller bug surfaced as a status).
#ifndef SPECSERVE_SCHEDULER_PLACEMENT_H_
#define SPECSERVE_SCHEDULER_PLACEMENT_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/specserve.pb.h"
#include "proto/worker.pb.h"

namespace specserve::scheduler {

// What placement needs to know about one worker (from WorkerPool's polls).
struct WorkerLoad {
  bool available = false;
  uint64_t memory_budget_bytes = 0;  // 0 = unknown (memory term counts as 0)
  uint64_t memory_used_bytes = 0;
  uint32_t active_bursts = 0;
  uint32_t sessions = 0;

  static WorkerLoad FromInfo(bool available,
                             const specserve::worker::v1::WorkerInfo& info);
};

struct PlacementOptions {
  double burst_weight = 0.05;
  // Memory fraction at which a worker counts as full.
  double full_fraction = 0.95;
};

struct Placement {
  int worker = -1;
  // The session's caches are not on `worker`: admit it there with its whole
  // history (prefill), instead of resuming.
  bool rebuild = false;
};

// `residency` and `current_worker` (-1 = none) are the session's, from the
// session table; `workers` is indexed like the worker pool.
absl::StatusOr<Placement> PlaceSession(specserve::v1::Residency residency,
                                       int current_worker,
                                       absl::Span<const WorkerLoad> workers,
                                       const PlacementOptions& options = {});

// The score used to rank workers (lower is better); exposed for tests.
double LoadScore(const WorkerLoad& w, const PlacementOptions& options);

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_PLACEMENT_H_
