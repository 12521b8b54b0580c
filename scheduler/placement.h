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
// - Least loaded = lowest score, score = memory fraction + burst_weight ×
//   active_bursts + session_weight × placed_sessions; ties go to fewer
//   sessions, then the lower index (deterministic). The memory fraction is
//   the larger of the polled one and the scheduler's live estimate
//   (placed_sessions × the polled bytes per session): polls lag, so sessions
//   placed since the last one count at once and a burst of new sessions
//   spreads instead of landing on one worker. Workers at or above
//   `full_fraction` of their budget, or where one more session of the
//   polled average size would pass it, are skipped while any other is
//   available (a full worker would evict parked sessions to take it).
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
  uint32_t sessions = 0;  // as polled
  // Sessions the scheduler holds there now (resident, or being admitted):
  // live, unlike the polled figures.
  uint32_t placed_sessions = 0;

  static WorkerLoad FromInfo(bool available,
                             const specserve::worker::v1::WorkerInfo& info);
};

struct PlacementOptions {
  double burst_weight = 0.01;  // a running burst weighs as one session
  double session_weight = 0.01;
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
// The memory fraction placement uses (see the rules above).
double EstimatedMemoryFraction(const WorkerLoad& w);
// Whether one more session of the polled average size fits the budget
// (true while the size is unknown). A worker it does not fit counts as full.
bool FitsAnotherSession(const WorkerLoad& w);

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_PLACEMENT_H_
