// The scheduler's truth about sessions (docs/DESIGN.md §2): residency, the
// worker holding the caches, the committed token history, capacity, the rewind
// position, lifetime telemetry and the spec gate's last decision. Workers hold
// caches; this table holds what is needed to rebuild them, so a session whose
// worker dies (LOST) is rebuilt on another worker by a prefill of its history
// and the client loses nothing it was sent.
//
// Usage:
//   SS_ASSIGN_OR_RETURN(SessionSnapshot s, table.Open(capacity, tenant));
//   SS_ASSIGN_OR_RETURN(SessionLease lease, table.Acquire(id, tenant));
//   ... run a burst; lease.AppendCommitted(tokens); lease.SetResidency(...);
//   // ~SessionLease: the session is idle again.
//
// Invariants:
// - Session ids are "ses_" + 32 hex digits of 128 bits from the kernel's
//   CSPRNG (getrandom): unguessable, so knowing one id says nothing of others.
// - A session belongs to the tenant that opened it. Every lookup names the
//   tenant; another tenant's session reads as NOT_FOUND, with the same message
//   as an unknown id (nothing leaks about its existence).
// - At most one lease per session (requests of a session are serialized): a
//   second Acquire gets ABORTED while the first is held.
// - committed.size() <= capacity; rewind_pos, when set, <= committed.size().
// - Closing removes the session at once. A lease held across Close keeps a
//   detached record: its updates are harmless and lease.closed() tells the
//   holder to stop and release the worker's caches.
// - A record's fields change only under the table's mutex.
#ifndef SPECSERVE_SCHEDULER_SESSION_TABLE_H_
#define SPECSERVE_SCHEDULER_SESSION_TABLE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/specserve.pb.h"
#include "scheduler/spec_gate.h"
#include "telemetry/spec_telemetry.h"

namespace specserve::scheduler {

// A copy of one session's state, without its token history.
struct SessionSnapshot {
  std::string id;
  std::string tenant;
  specserve::v1::Residency residency = specserve::v1::NEW;
  // Meaningful while ACTIVE (and remembered while idle); UNSPECIFIED before
  // the gate's first decision.
  specserve::v1::DecodeMode mode = specserve::v1::DECODE_MODE_UNSPECIFIED;
  // Index into the worker pool; -1 = none (NEW, LOST).
  int worker = -1;
  uint32_t committed_len = 0;
  uint32_t capacity = 0;
  std::optional<uint32_t> rewind_pos;
  // Positions inside earlier prompts whose state the worker copy saved
  // (SessionState.prefix_checkpoints, as of its last park), ascending, each
  // <= committed_len; the copy drops them when it is offloaded.
  std::vector<uint32_t> prefix_checkpoints;
  // Sums of the workers' per-burst deltas (BurstSummary.telemetry_delta).
  telemetry::SpecTelemetry telemetry;
  specserve::v1::GateDecision last_gate_decision;
  SpecGateState gate_state;
  // The gate demoted the session (one-way: it never speculates again). A
  // BATCHED session not demoted was admitted without draft state (its turns
  // so far asked for no speculation) and is promoted by the first turn that
  // asks for it and that the gate lets speculate.
  bool demoted = false;
  absl::Time created;
  absl::Time last_used;
  // When `residency` (or `worker`) was last set: what a worker reported
  // before then does not describe it (MarkWorkerLost, ReconcileWorker).
  absl::Time residency_since;
  bool busy = false;

  // `worker_addresses` maps worker indexes to addresses (the pool's order).
  specserve::v1::SessionInfo ToProto(
      absl::Span<const std::string> worker_addresses) const;
};

struct SessionTableOptions {
  uint32_t max_sessions = 10000;
  // Capacity of a session opened with capacity 0.
  uint32_t default_capacity = 4096;
  // Largest capacity allowed (the model context).
  uint32_t max_capacity = 4096;
  std::function<absl::Time()> now = [] { return absl::Now(); };
};

class SessionTable;

// Exclusive right to run a turn on a session. Move-only; destroying it marks
// the session idle. Every method is thread-safe, but a lease is meant to be
// used by the one request that holds it.
class SessionLease {
 public:
  SessionLease() = default;
  SessionLease(SessionLease&& other) noexcept;
  SessionLease& operator=(SessionLease&& other) noexcept;
  ~SessionLease();

  bool valid() const { return table_ != nullptr; }
  const std::string& id() const;
  SessionSnapshot Snapshot() const;
  // A copy of the committed history (for a rebuild, or to match a prompt
  // against it).
  std::vector<uint32_t> History() const;
  // The session was closed while this lease was held: stop the request and
  // release the worker's caches.
  bool closed() const;

  void SetResidency(specserve::v1::Residency residency,
                    specserve::v1::DecodeMode mode, int worker);
  // Appends newly committed tokens. OUT_OF_RANGE (nothing appended) if they
  // would pass the capacity: a worker must never commit past it.
  absl::Status AppendCommitted(absl::Span<const uint32_t> tokens);
  // Drops history after `pos` (REWIND). OUT_OF_RANGE if pos > committed.
  absl::Status TruncateTo(uint32_t pos);
  // The last prompt checkpoint; nullopt = none. OUT_OF_RANGE past committed.
  absl::Status SetRewindPos(std::optional<uint32_t> pos);
  // The worker copy's prefix checkpoints (SessionSnapshot); those past
  // committed are ignored.
  void SetPrefixCheckpoints(absl::Span<const uint32_t> positions);
  void AddTelemetry(const specserve::v1::SessionTelemetry& delta);
  void SetGateDecision(const SpecGateDecision& decision);
  // The gate demoted the session (SessionSnapshot::demoted).
  void MarkDemoted();
  // Releases the lease now (the destructor does the same).
  void Release();
  // Release, returning whether the session had been closed by then. Both
  // happen under the table's lock, as Close reads `busy`: a close either
  // sees the session busy (and leaves its worker copy to the lease holder,
  // who then sees true here) or idle (and frees the copy itself).
  bool ReleaseSeeingClose();

 private:
  friend class SessionTable;
  struct Record;
  SessionLease(SessionTable* table, std::shared_ptr<Record> record)
      : table_(table), record_(std::move(record)) {}
  SessionTable* table_ = nullptr;
  std::shared_ptr<Record> record_;
};

class SessionTable {
 public:
  explicit SessionTable(SessionTableOptions options);
  SessionTable(const SessionTable&) = delete;
  SessionTable& operator=(const SessionTable&) = delete;

  // A new NEW session. capacity 0 = the default; INVALID_ARGUMENT above
  // max_capacity; RESOURCE_EXHAUSTED when max_sessions are open.
  absl::StatusOr<SessionSnapshot> Open(uint32_t capacity,
                                       const std::string& tenant);
  // Open and Acquire in one step (a Generate that creates its session).
  absl::StatusOr<SessionLease> OpenAndAcquire(uint32_t capacity,
                                              const std::string& tenant);
  absl::StatusOr<SessionSnapshot> Get(const std::string& id,
                                      const std::string& tenant) const;
  // The tenant's sessions, oldest first.
  std::vector<SessionSnapshot> List(const std::string& tenant) const;

  struct Closed {
    // A request was in flight: the caller cancels it (its lease sees
    // closed()).
    bool was_busy = false;
    // Where its caches are (-1 = nowhere): the caller releases them.
    int worker = -1;
    specserve::v1::Residency residency = specserve::v1::NEW;
  };
  absl::StatusOr<Closed> Close(const std::string& id,
                               const std::string& tenant);

  // Closes every session (Admin.LoadModel: caches and histories belong to
  // the old model); a lease still held sees closed(). Returns how many.
  int CloseAll();

  // NOT_FOUND, or ABORTED "session X already has a request in flight".
  absl::StatusOr<SessionLease> Acquire(const std::string& id,
                                       const std::string& tenant);

  // Worker `worker` died or lost its sessions: every session resident there
  // since before `as_of` becomes LOST (history kept; the next turn rebuilds
  // it). Returns their ids. Busy sessions are left to their requests, whose
  // own failure handling marks them (a request owns its session's residency
  // while it runs).
  std::vector<std::string> MarkWorkerLost(
      int worker, absl::Time as_of = absl::InfiniteFuture());

  // One session copy a worker reported holding: PARKED or OFFLOADED, or
  // ACTIVE while a call there holds it.
  struct WorkerCopy {
    std::string id;
    specserve::v1::Residency residency = specserve::v1::PARKED;
  };
  struct Reconciled {
    // Placed on the worker per the table but not held there (its pool
    // dropped them, or it restarted): now LOST.
    std::vector<std::string> lost;
    // Sessions of this table held there but placed elsewhere (moved, or
    // LOST): nothing will use those copies; release them. Ids the table
    // does not know are left alone: a worker may serve several schedulers,
    // and closed sessions are released by their Close.
    std::vector<std::string> abandoned;
  };
  // Brings the table in line with `copies`, the complete list of what
  // worker `worker` held when asked at `as_of`: idle sessions there whose
  // residency was set before `as_of` take the reported residency (PARKED or
  // OFFLOADED) or become LOST when absent. Busy sessions, and sessions
  // whose residency changed after `as_of` (the list may predate it), are
  // left alone on both counts.
  Reconciled ReconcileWorker(int worker, absl::Span<const WorkerCopy> copies,
                             absl::Time as_of);

  struct Expired {
    std::string id;
    int worker = -1;
    specserve::v1::Residency residency = specserve::v1::NEW;
  };
  // Removes idle (not busy) sessions unused for `idle_ttl` or longer and
  // returns them, so the caller releases their caches on their workers.
  std::vector<Expired> ExpireIdle(absl::Duration idle_ttl);

  size_t size() const;
  // Sessions by residency (for specserve_sessions{residency}).
  std::map<specserve::v1::Residency, int> CountByResidency() const;
  // Sessions on `worker` in `residency` (ACTIVE ones = the gate's batch size).
  int CountOnWorker(int worker, specserve::v1::Residency residency) const;
  // Sessions whose caches are on `worker` (ACTIVE, PARKED, OFFLOADED),
  // including ones being admitted there (placement's live load).
  int CountPlacedOn(int worker) const;

 private:
  friend class SessionLease;
  using Record = SessionLease::Record;

  // NOT_FOUND unless the id exists and belongs to the tenant.
  absl::StatusOr<std::shared_ptr<Record>> FindLocked(
      const std::string& id, const std::string& tenant) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<Record>> OpenLocked(uint32_t capacity,
                                                     const std::string& tenant)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  SessionSnapshot SnapshotLocked(const Record& r) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const SessionTableOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Record>> sessions_
      ABSL_GUARDED_BY(mu_);
};

// 128 random bits from the kernel's CSPRNG, as `prefix` + 32 hex digits.
absl::StatusOr<std::string> NewRandomId(absl::string_view prefix);
// NewRandomId("ses_").
absl::StatusOr<std::string> NewSessionId();

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_SESSION_TABLE_H_
