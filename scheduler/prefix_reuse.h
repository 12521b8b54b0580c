// Automatic prefix reuse in Generate (docs/DESIGN.md "Prefix reuse"): the
// scheduler's side. A request with nothing resident yet (a one-shot request,
// or a new session's first turn) whose prompt starts with a history some
// parked session holds at a reusable position (its prompt checkpoint or its
// committed end) starts as a fork of that state on that worker
// (ForkSession, proto/worker.proto) and prefills only the rest.
//
// Sources are sessions themselves: every parked session's positions go into
// the PrefixCache (scheduler/prefix_cache.h), and a finished one-shot
// request's session is kept parked as a cache-owned session instead of
// being released: filed in the session table under an internal tenant no
// bearer token can name (so it is in no tenant's ListSessions and no
// client can address it), counted against PrefixCacheOptions::max_owned and
// released least recently used. The worker's pool offloads and drops idle
// sessions under its budgets as it does for any session; the residency sync
// then marks them LOST, and a lookup skips and forgets such entries.
//
// Placement: the hits are weighed against the workers' loads
// (PlaceNewSession, scheduler/placement.h): a hit on a worker too busy for
// the prefill it saves is not used, and the session is placed and prefilled
// as usual (that worker then holds the prefix too).
//
// Exactness: a hit is checked against the session table (the source is
// idle, on that worker, with pos at its rewind position or committed end)
// and the worker compares the prefix with the source's own history before
// copying, so a stale entry only costs a miss. A failed fork falls back to
// the usual placement and prefill.
#ifndef SPECSERVE_SCHEDULER_PREFIX_REUSE_H_
#define SPECSERVE_SCHEDULER_PREFIX_REUSE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/specserve.pb.h"
#include "scheduler/placement.h"
#include "scheduler/prefix_cache.h"
#include "scheduler/scheduler_context.h"
#include "scheduler/session_table.h"
#include "telemetry/metrics.h"

namespace specserve::scheduler {

// The session-table tenant of `tenant`'s cache-owned sessions: tenant names
// are letters, digits, '.', '_' and '-' (scheduler/credentials.h), so no
// caller can be this tenant.
std::string OwnedTenant(const std::string& tenant);

struct PrefixFork {
  int worker = -1;
  uint32_t pos = 0;  // prompt[0:pos] came from the source
  specserve::v1::DecodeMode mode = specserve::v1::SPECULATIVE;
};

class PrefixReuse {
 public:
  // Registers its metrics in `registry` (must outlive this). `placement`:
  // how hits are weighed against load (PlaceNewSession).
  PrefixReuse(PrefixCacheOptions options, telemetry::Registry* registry,
              PlacementOptions placement = {});

  // Tries to make `lease`'s session (NEW, nothing resident) a copy of a
  // usable checkpoint of `tenant` that `prompt` starts with, on the worker
  // PlaceNewSession picks from the workers' loads and their longest hits.
  // `speculative`: the session needs draft state. On success the worker holds
  // the session with prompt[0:pos] (its prompt checkpoint at pos) and the lease
  // is ACTIVE there; the caller records the prefix in the history. nullopt: no
  // usable hit (the lease is as before).
  std::optional<PrefixFork> TryFork(SchedulerContext* ctx,
                                    const std::string& tenant,
                                    SessionLease* lease,
                                    absl::Span<const uint32_t> prompt,
                                    bool speculative, absl::Time until);
  // After `lease`'s session was parked: records its reusable positions.
  // `owned`: a one-shot request's session, now the cache's; cache-owned
  // sessions pushed out by it are released (table and worker).
  void RecordParked(SchedulerContext* ctx, const std::string& tenant,
                    const SessionLease& lease, bool owned);
  // Checkpoint bytes on device and host, summed over the workers (their
  // pools' figures: every parked session is a checkpoint), and the count of
  // cache-owned sessions. Called by the scheduler's housekeeping.
  void UpdateGauges(const WorkerPool& workers);

  PrefixCache& cache() { return cache_; }

 private:
  // Closes a cache-owned session and frees its worker copy.
  void ReleaseOwned(SchedulerContext* ctx, const PrefixSource& source);
  // Whether `hit` still describes an idle session that holds the state.
  // `*inside_prompt`: the hit is one of its prefix checkpoints only, which
  // the worker drops on offload (a refusal of it says nothing of the rest).
  bool StillValid(SchedulerContext* ctx, const PrefixHit& hit, bool speculative,
                  bool* forget, bool* inside_prompt) const;
  // The hits that StillValid passes, on available workers, in `hits`' order
  // (longest first), with each one's inside_prompt; forgets stale entries.
  std::vector<PrefixHit> UsableHits(SchedulerContext* ctx,
                                    const std::vector<PrefixHit>& hits,
                                    bool speculative,
                                    std::vector<bool>* inside_prompt);

  PrefixCache cache_;
  const PlacementOptions placement_;
  telemetry::Counter* lookups_;
  telemetry::Counter* hits_;
  telemetry::Counter* queried_tokens_;
  telemetry::Counter* hit_tokens_;
  telemetry::Gauge* owned_sessions_;
  telemetry::Gauge* device_bytes_;
  telemetry::Gauge* host_bytes_;
};

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_PREFIX_REUSE_H_
