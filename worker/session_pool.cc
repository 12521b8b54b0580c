#include "worker/session_pool.h"

#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "telemetry/constant_time.h"
#include "telemetry/status_macros.h"

namespace specserve::worker {

SessionPool::SessionPool(SessionPoolOptions options,
                         spec::ModelExecutor* executor)
    : options_(options), executor_(executor) {}

namespace {

absl::Status NotOnThisWorker(const std::string& id) {
  return absl::NotFoundError(
      absl::StrCat("session ", id, " is not on this worker"));
}

// The session's saved recurrent/conv state (null without a checkpoint).
model::TrunkCheckpoint* TrunkOf(spec::SpecSession* s) {
  spec::TurnCheckpoint* c = s->checkpoint();
  return c == nullptr ? nullptr : c->trunk.get();
}

}  // namespace

uint64_t SessionPool::BytesOf(const spec::SpecSession& s) const {
  uint64_t bytes = executor_->model()->StateBytes(*s.caches());
  const model::TrunkCheckpoint* c = TrunkOf(const_cast<spec::SpecSession*>(&s));
  if (c != nullptr) bytes += c->bytes();
  for (const auto& p : s.prefix_checkpoints()) bytes += p->trunk->bytes();
  return bytes;
}

uint64_t SessionPool::HostBytesOf(const Entry& e) {
  if (e.snapshot == nullptr) return 0;
  const model::TrunkCheckpoint* c = TrunkOf(e.session.get());
  return e.snapshot->bytes() + (c == nullptr ? 0 : c->host_bytes());
}

void SessionPool::TouchLocked(const std::string& id, Entry* e) {
  UnlinkLocked(e);
  e->lru_pos = lru_.insert(lru_.end(), id);
  e->in_lru = true;
}

void SessionPool::UnlinkLocked(Entry* e) {
  if (e->in_lru) lru_.erase(e->lru_pos);
  e->in_lru = false;
}

void SessionPool::AwaitNoReadersLocked(const std::string& id) {
  for (auto it = entries_.find(id);
       it != entries_.end() && it->second.readers > 0; it = entries_.find(id)) {
    readers_done_.Wait(&mu_);
  }
}

absl::StatusOr<SessionPool::Lease> SessionPool::Insert(
    std::unique_ptr<spec::SpecSession> session, std::string owner) {
  const std::string id = session->id();
  absl::MutexLock lock(&mu_);
  if (entries_.count(id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("session ", id, " already exists on this worker"));
  }
  evicted_.erase(id);
  Entry& e = entries_[id];
  e.session = std::move(session);
  e.owner = std::move(owner);
  e.busy = true;
  e.device_bytes = BytesOf(*e.session);
  return Lease(this, e.session.get());
}

absl::StatusOr<SessionPool::Lease> SessionPool::Acquire(
    const std::string& id, absl::string_view owner) {
  absl::MutexLock lock(&mu_);
  AwaitNoReadersLocked(id);
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    auto evicted = evicted_.find(id);
    if (evicted != evicted_.end() &&
        telemetry::ConstantTimeEquals(evicted->second, owner)) {
      return absl::NotFoundError(absl::StrCat(
          "session ", id,
          " was evicted from this worker under memory pressure; rebuild it "
          "from its history"));
    }
    return NotOnThisWorker(id);
  }
  Entry& e = it->second;
  if (!telemetry::ConstantTimeEquals(e.owner, owner)) {
    return NotOnThisWorker(id);
  }
  if (e.busy) {
    return absl::AbortedError(absl::StrCat(
        "session ", id, " is already running a request on this worker"));
  }
  SS_RETURN_IF_ERROR(RestoreLocked(&e));
  UnlinkLocked(&e);
  e.busy = true;
  return Lease(this, e.session.get());
}

absl::Status SessionPool::RestoreLocked(Entry* e) {
  if (e->residency != Residency::kOffloaded) return absl::OkStatus();
  const model::Model* model = executor_->model();
  model::TrunkCheckpoint* checkpoint = TrunkOf(e->session.get());
  absl::Status s = executor_->Exclusive([&] {
    // The checkpoint first: a failure of either leaves the session
    // offloaded as a whole.
    if (checkpoint != nullptr) {
      absl::Status c = model->ReloadCheckpoint(checkpoint);
      if (!c.ok()) return c;
    }
    absl::Status r = model->Restore(e->session->caches(), *e->snapshot);
    if (!r.ok() && checkpoint != nullptr) {
      // Best effort; a checkpoint left on the device is counted there.
      model->OffloadCheckpoint(checkpoint).IgnoreError();
    }
    return r;
  });
  if (!s.ok()) {
    e->device_bytes = BytesOf(*e->session);
    return s;
  }
  e->snapshot.reset();
  e->residency = Residency::kResident;
  e->device_bytes = BytesOf(*e->session);
  ++counters_.restores;
  return absl::OkStatus();
}

absl::Status SessionPool::WithIdle(const std::string& id,
                                   absl::string_view owner, const IdleFn& fn) {
  spec::SpecSession* session = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(id);
    if (it == entries_.end() ||
        !telemetry::ConstantTimeEquals(it->second.owner, owner)) {
      return NotOnThisWorker(id);
    }
    Entry& e = it->second;
    if (e.busy) {
      return absl::AbortedError(
          absl::StrCat("session ", id, " is running a request on this worker"));
    }
    SS_RETURN_IF_ERROR(RestoreLocked(&e));
    ++e.readers;
    UnlinkLocked(&e);  // not evictable while read
    session = e.session.get();
  }
  // Outside the pool: std::map nodes keep their address, and the entry
  // stays (Release and Acquire wait for its readers).
  absl::Status s = fn(*session);
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  CHECK(it != entries_.end() && it->second.session.get() == session)
      << "session " << id << " left the pool while read";
  Entry& e = it->second;
  if (--e.readers == 0) {
    // A source that was read is recently used: the last to be offloaded.
    TouchLocked(id, &e);
    readers_done_.SignalAll();
    EnforceBudgetsLocked();
  }
  return s;
}

void SessionPool::Return(spec::SpecSession* session, bool discard) {
  absl::MutexLock lock(&mu_);
  if (releasing_.erase(session) > 0) return;  // released while leased
  auto it = entries_.find(session->id());
  CHECK(it != entries_.end() && it->second.session.get() == session)
      << "lease of an unknown session";
  Entry& e = it->second;
  if (discard) {
    entries_.erase(it);
    return;
  }
  e.busy = false;
  e.device_bytes = BytesOf(*e.session);
  TouchLocked(it->first, &e);
  EnforceBudgetsLocked();
}

absl::Status SessionPool::Release(const std::string& id,
                                  absl::string_view owner) {
  absl::MutexLock lock(&mu_);
  AwaitNoReadersLocked(id);
  auto it = entries_.find(id);
  if (it == entries_.end() ||
      !telemetry::ConstantTimeEquals(it->second.owner, owner)) {
    return NotOnThisWorker(id);
  }
  if (it->second.busy) {
    // Detach now, free when the lease returns (see the header).
    spec::SpecSession* const leased = it->second.session.get();
    releasing_.emplace(leased, std::move(it->second));
    entries_.erase(it);
    return absl::OkStatus();
  }
  UnlinkLocked(&it->second);
  entries_.erase(it);
  return absl::OkStatus();
}

void SessionPool::EnforceBudgetsLocked() {
  auto totals = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::pair<uint64_t, uint64_t> t{0, 0};
    for (auto& [id, e] : entries_) {
      t.first += e.device_bytes;
      t.second += HostBytesOf(e);
    }
    return t;
  };
  auto [device, host] = totals();
  // Offload idle resident sessions, oldest first, until the device budget
  // holds.
  for (auto it = lru_.begin();
       device > options_.device_budget_bytes && it != lru_.end(); ++it) {
    Entry& e = entries_.at(*it);
    if (e.residency != Residency::kResident) continue;
    absl::StatusOr<std::unique_ptr<model::HostStateSnapshot>> snap;
    const model::Model* model = executor_->model();
    model::TrunkCheckpoint* checkpoint = TrunkOf(e.session.get());
    // Lock order: pool, then model (nothing takes them the other way).
    absl::Status st = executor_->Exclusive([&] {
      snap = model->Offload(e.session->caches());
      if (!snap.ok()) return snap.status();
      // Prefix checkpoints are a cache of reusable positions, not part of
      // the session: they go rather than take host memory.
      e.session->DropPrefixCheckpoints();
      // The checkpoint goes too: offloading exists to free device memory.
      if (checkpoint != nullptr) {
        absl::Status c = model->OffloadCheckpoint(checkpoint);
        if (!c.ok()) {
          LOG(WARNING) << "session " << *it << ": its checkpoint stays in "
                       << "device memory: " << c;
        }
      }
      return absl::OkStatus();
    });
    if (!st.ok()) {
      LOG(WARNING) << "offload of session " << *it << " failed: " << st;
      continue;
    }
    device -= e.device_bytes;
    e.snapshot = std::move(*snap);
    e.residency = Residency::kOffloaded;
    e.device_bytes = BytesOf(*e.session);  // 0 unless the checkpoint stayed
    device += e.device_bytes;
    host += HostBytesOf(e);
    ++counters_.offloads;
    ++epoch_;
  }
  // Drop offloaded sessions, oldest first, until the host budget holds. The
  // most recently used session is never dropped: with a budget smaller than
  // one session it would be gone before its next burst, every time.
  const auto mru = lru_.empty() ? lru_.end() : std::prev(lru_.end());
  for (auto it = lru_.begin();
       host > options_.host_budget_bytes && it != lru_.end() && it != mru;) {
    Entry& e = entries_.at(*it);
    if (e.residency != Residency::kOffloaded) {
      ++it;
      continue;
    }
    host -= HostBytesOf(e);
    device -= e.device_bytes;
    const std::string id = *it;
    it = lru_.erase(it);
    e.in_lru = false;
    evicted_[id] = std::move(e.owner);
    entries_.erase(id);
    ++counters_.drops;
    ++epoch_;
    LOG(INFO) << "dropped session " << id << " (host memory budget)";
  }
}

SessionPool::Stats SessionPool::stats() const {
  // Never waits on the pool: while a budget pass holds it (offloads copy
  // gigabytes and wait for the model) the last figures are answered, so
  // GetWorkerInfo, the scheduler's liveness poll, stays fast under load.
  if (!mu_.TryLock()) {
    absl::MutexLock published(&published_mu_);
    return published_stats_;
  }
  Stats s = StatsLocked();
  mu_.Unlock();
  absl::MutexLock published(&published_mu_);
  published_stats_ = s;
  return s;
}

SessionPool::Stats SessionPool::StatsLocked() const {
  Stats s = counters_;
  for (const auto& [id, e] : entries_) {
    ++s.sessions;
    if (e.busy) ++s.busy;
    if (e.residency == Residency::kOffloaded) ++s.offloaded;
    s.host_bytes += HostBytesOf(e);
    s.device_bytes += e.device_bytes;
  }
  for (const auto& [session, e] : releasing_) {  // freed once returned
    ++s.sessions;
    ++s.busy;
    s.device_bytes += e.device_bytes;
  }
  return s;
}

absl::StatusOr<Residency> SessionPool::ResidencyOf(
    const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("session ", id, " is unknown"));
  }
  return it->second.residency;
}

std::optional<SessionPool::Listing> SessionPool::TryList() const {
  if (!mu_.TryLock()) return std::nullopt;
  Listing out = ListLocked();
  mu_.Unlock();
  return out;
}

SessionPool::Listing SessionPool::List() const {
  absl::MutexLock lock(&mu_);
  return ListLocked();
}

SessionPool::Listing SessionPool::ListLocked() const {
  Listing out;
  out.epoch = epoch_;
  out.sessions.reserve(entries_.size());
  for (const auto& [id, e] : entries_) {
    out.sessions.push_back({id, e.owner, e.busy, e.residency});
  }
  return out;
}

uint64_t SessionPool::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

int SessionPool::ReleaseIdle() {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.busy || it->second.readers > 0) {
      ++it;
      continue;
    }
    UnlinkLocked(&it->second);
    it = entries_.erase(it);
    ++n;
  }
  if (n > 0) ++epoch_;
  return n;
}

SessionPool::Lease::Lease(Lease&& other) noexcept
    : pool_(other.pool_), session_(other.session_), discard_(other.discard_) {
  other.session_ = nullptr;
}

SessionPool::Lease::~Lease() {
  if (session_ != nullptr) pool_->Return(session_, discard_);
}

}  // namespace specserve::worker
