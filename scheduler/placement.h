// Where a session's next turn runs: a pure function over snapshots of the
// session's residency and the workers' loads, so the policy is tested with
// made-up loads and the caller does all the I/O.
//
// Rules:
// - A session resident on a worker (ACTIVE, PARKED, OFFLOADED) stays there
//   while that worker is available: its caches are there.
// - A NEW or LOST session, or one whose worker is no longer available, goes to
//   the least-loaded available worker and is (re)built there by a prefill of
//   its history (`rebuild` = true); for a NEW one whose prompt's prefix a
//   worker holds, see prefix-aware placement below.
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
// - Prefix-aware placement (PlaceNewSession): a new session's first turn
//   whose prompt starts with a state some workers hold (automatic prefix
//   reuse, scheduler/prefix_reuse.h) may go to such a holder instead, to
//   resume from that state: a hit is worth the prefill it saves and no more. A
//   holder qualifies while its load exceeds the least-loaded worker's by at
//   most prefix_balance_sessions + cached tokens / prefix_tokens_per_session
//   sessions (a session weighs session_weight of the score), or is at most
//   prefix_balance_ratio times the least-loaded worker's load; a full holder
//   (as above) qualifies only where every worker is full. Of the qualifying
//   holders the one with the most cached tokens wins (ties as above); with
//   none, the least-loaded worker takes the session and prefills its whole
//   prompt, and from then on holds the prefix too, so a prompt many sessions
//   share spreads over the workers instead of piling onto the first one that
//   held it.
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
  // Prefix-aware placement (PlaceNewSession, the rules above).
  // Load imbalance, in sessions, that any hit outweighs: a couple of
  // sessions more on one worker cost little next to a prefill.
  double prefix_balance_sessions = 2;
  // Prompt tokens of prefill a hit saves that outweigh one more session of
  // imbalance (0: a hit's length adds nothing).
  double prefix_tokens_per_session = 1024;
  // A holder with at most this multiple of the least-loaded worker's load
  // qualifies whatever the difference: at high loads a few sessions more
  // are a small share.
  double prefix_balance_ratio = 1.25;
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

struct PrefixPlacement {
  int worker = -1;
  // Prompt tokens whose state `worker` holds: the session starts from them
  // (a fork of that state). 0: it is admitted there and prefills its whole
  // prompt.
  uint32_t cached_tokens = 0;
};

// Where a NEW session's first turn runs (see the rules above).
// `cached_tokens[i]`: the longest prefix of its prompt whose state worker i
// holds (0: none), indexed like `workers`; a size mismatch is
// INVALID_ARGUMENT. Errors as PlaceSession's.
absl::StatusOr<PrefixPlacement> PlaceNewSession(
    absl::Span<const WorkerLoad> workers,
    absl::Span<const uint32_t> cached_tokens,
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
