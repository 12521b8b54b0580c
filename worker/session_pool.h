// The worker's sessions: who is in use, who is idle, and where idle sessions'
// caches live under memory pressure (docs/DESIGN.md §1 "pool").
//
// Every session is in the pool from Admit to Release. A caller takes one with
// Acquire() (exclusive: a second Acquire gets ABORTED) and gives it back by
// dropping the Lease. Idle sessions are evicted least-recently-used:
//  - over the device budget, their caches are offloaded to host memory
//    (Model::Offload; exact: a resumed session continues bit-identically);
//  - over the host budget, offloaded sessions are dropped (the scheduler
//    rebuilds them from their token history: Acquire then says NOT_FOUND
//    with "evicted").
// Busy sessions are never evicted, so budgets can be exceeded while every
// session is busy; they are enforced again as leases return.
//
// Each session belongs to the owner it was inserted with (proto/worker.proto:
// the scheduler's owner token; "" for callers that give none). Acquire and
// Release with another owner answer NOT_FOUND with the message of an unknown
// id and change nothing (owners are compared in constant time).
#ifndef SPECSERVE_WORKER_SESSION_POOL_H_
#define SPECSERVE_WORKER_SESSION_POOL_H_

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "worker/model/model.h"
#include "worker/spec/model_executor.h"
#include "worker/spec/spec_session.h"

namespace specserve::worker {

struct SessionPoolOptions {
  uint64_t device_budget_bytes = 4ull << 30;
  uint64_t host_budget_bytes = 8ull << 30;
};

enum class Residency { kResident, kOffloaded };

class SessionPool {
 public:
  class Lease;

  SessionPool(SessionPoolOptions options, spec::ModelExecutor* executor);

  // Adds a new session of `owner`, leased to the caller. ALREADY_EXISTS for
  // a known id.
  absl::StatusOr<Lease> Insert(std::unique_ptr<spec::SpecSession> session,
                               std::string owner = "");
  // Exclusive use of a session; restores offloaded caches first.
  // NOT_FOUND (unknown, another owner's, or evicted), ABORTED (in use).
  absl::StatusOr<Lease> Acquire(const std::string& id,
                                absl::string_view owner = "");
  // Frees a session. One still leased (a burst the scheduler gave up on —
  // cancelled, past its deadline — runs until its next emit fails) is
  // detached at once, so its id is free for a new Admit, and freed when its
  // lease returns. Without this, the scheduler's Release raced the burst's
  // end, got ABORTED, and the copy stayed in the pool for good.
  // NOT_FOUND, nothing freed, for an unknown id or another owner's.
  absl::Status Release(const std::string& id, absl::string_view owner = "");

  // Runs `fn` on the idle session `id` of `owner` (its caches restored
  // first when offloaded) as one of its readers: several readers run at
  // once, the pool stays free for every other session, and while any reads,
  // the session is neither offloaded nor dropped, and Acquire and Release
  // of it wait for the readers instead of being refused (how ForkSession
  // reads a source many new requests fork at once, and another request may
  // want next). `fn` only reads the session. NOT_FOUND as Acquire, ABORTED
  // while leased.
  using IdleFn = std::function<absl::Status(const spec::SpecSession&)>;
  absl::Status WithIdle(const std::string& id, absl::string_view owner,
                        const IdleFn& fn);

  struct Stats {
    int sessions = 0;
    int busy = 0;
    int offloaded = 0;
    uint64_t device_bytes = 0;  // caches + checkpoints of resident sessions
    uint64_t host_bytes = 0;    // offloaded snapshots and their checkpoints
    uint64_t offloads = 0;
    uint64_t restores = 0;
    uint64_t drops = 0;
  };
  // Never blocks on the pool: while it is held, the figures of the last
  // call that found it free.
  Stats stats() const;
  uint64_t device_budget_bytes() const { return options_.device_budget_bytes; }
  // Device bytes a session's copy holds: its caches, its turn checkpoint and
  // its prefix checkpoints (what the device budget counts for it). The caller
  // holds the session (a lease) or the pool's entry is idle.
  uint64_t BytesOf(const spec::SpecSession& s) const;
  // Residency of an idle session (NOT_FOUND if unknown).
  absl::StatusOr<Residency> ResidencyOf(const std::string& id) const;

  // Every session with where it is, and the epoch this list belongs to: the
  // count of changes the pool made to idle sessions on its own (offloads,
  // drops, ReleaseIdle). A caller that tracks sessions by the calls it makes
  // needs a new list only when the epoch moved.
  struct Listed {
    std::string id;
    std::string owner;
    bool busy = false;
    Residency residency = Residency::kResident;
  };
  struct Listing {
    uint64_t epoch = 0;
    std::vector<Listed> sessions;
  };
  Listing List() const;
  // List() unless the pool is held now (nullopt): for the liveness poll.
  std::optional<Listing> TryList() const;
  uint64_t epoch() const;
  // Frees every idle (not leased) session; returns how many. Leased ones
  // (a burst running) and ones being read (WithIdle) are left: they are
  // idle again once that ends.
  int ReleaseIdle();

  // Exclusive use of one session; returns it to the pool when destroyed.
  class Lease {
   public:
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&&) = delete;
    Lease(const Lease&) = delete;
    ~Lease();
    spec::SpecSession* get() const { return session_; }
    spec::SpecSession* operator->() const { return session_; }
    // Drops the session instead of returning it (e.g. after an error that
    // left its caches inconsistent).
    void Discard() { discard_ = true; }

   private:
    friend class SessionPool;
    Lease(SessionPool* pool, spec::SpecSession* session)
        : pool_(pool), session_(session) {}
    SessionPool* pool_;
    spec::SpecSession* session_;
    bool discard_ = false;
  };

 private:
  struct Entry {
    std::unique_ptr<spec::SpecSession> session;
    std::string owner;
    bool busy = false;
    // WithIdle calls reading it now; while > 0 it is out of lru_ (never
    // evicted) and Acquire/Release wait on readers_done_.
    int readers = 0;
    Residency residency = Residency::kResident;
    // When offloaded; the session's checkpoint then holds its own host copy
    // (model::TrunkCheckpoint::offloaded).
    std::unique_ptr<model::HostStateSnapshot> snapshot;
    // Backend bytes it holds now: caches and checkpoint while resident, 0
    // once offloaded.
    uint64_t device_bytes = 0;
    // Position in lru_ (idle sessions only; front = least recently used).
    std::list<std::string>::iterator lru_pos;
    bool in_lru = false;
  };

  void Return(spec::SpecSession* session, bool discard);
  // Brings an offloaded entry's caches and checkpoint back into device
  // memory (a no-op for a resident one); on error it stays offloaded.
  absl::Status RestoreLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Host bytes of an offloaded entry: its snapshot and its checkpoint's copy.
  static uint64_t HostBytesOf(const Entry& e);
  // Offloads/drops idle sessions until the budgets hold (or none is idle).
  void EnforceBudgetsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Stats StatsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Listing ListLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TouchLocked(const std::string& id, Entry* e)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnlinkLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until session `id` is unknown or has no readers.
  void AwaitNoReadersLocked(const std::string& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SessionPoolOptions options_;
  spec::ModelExecutor* const executor_;

  mutable absl::Mutex mu_;
  // Signalled whenever an entry's last reader leaves.
  absl::CondVar readers_done_;
  // stats()'s answer while mu_ is held elsewhere.
  mutable absl::Mutex published_mu_;
  mutable Stats published_stats_ ABSL_GUARDED_BY(published_mu_);
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);
  // Sessions released while leased (see Release), keyed by the session the
  // lease points at; freed by Return. Counted in stats() until then.
  std::map<const spec::SpecSession*, Entry> releasing_ ABSL_GUARDED_BY(mu_);
  // Ids dropped under memory pressure, with their owners, so Acquire can
  // tell their owner why.
  std::map<std::string, std::string> evicted_ ABSL_GUARDED_BY(mu_);
  Stats counters_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace specserve::worker

#endif  // SPECSERVE_WORKER_SESSION_POOL_H_
