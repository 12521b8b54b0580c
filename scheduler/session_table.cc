#include "scheduler/session_table.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace specserve::scheduler {

namespace v1 = specserve::v1;

// One session. Every field is guarded by the owning table's mutex (the lease
// reaches it through table_->mu_).
struct SessionLease::Record {
  SessionSnapshot meta;  // meta.committed_len is derived from `committed`
  std::vector<uint32_t> committed;
  bool closed = false;
};

namespace {

bool IsResident(v1::Residency r) {
  return r == v1::ACTIVE || r == v1::PARKED || r == v1::OFFLOADED;
}

absl::Status NotFound(const std::string& id) {
  return absl::NotFoundError(absl::StrCat("session ", id, " not found"));
}

}  // namespace

absl::StatusOr<std::string> NewRandomId(absl::string_view prefix) {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(
          absl::StrCat("getrandom failed (errno ", errno, ")"));
    }
    got += static_cast<size_t>(n);
  }
  return absl::StrCat(
      prefix, absl::BytesToHexString(absl::string_view(
                  reinterpret_cast<const char*>(bytes), sizeof(bytes))));
}

absl::StatusOr<std::string> NewSessionId() { return NewRandomId("ses_"); }

// ---------------------------------------------------------------------------
// SessionSnapshot

v1::SessionInfo SessionSnapshot::ToProto(
    absl::Span<const std::string> worker_addresses) const {
  v1::SessionInfo p;
  p.set_session_id(id);
  p.set_residency(residency);
  p.set_mode(mode);
  if (worker >= 0 && static_cast<size_t>(worker) < worker_addresses.size()) {
    p.set_worker(worker_addresses[worker]);
  }
  p.set_committed_tokens(committed_len);
  p.set_capacity(capacity);
  if (rewind_pos.has_value()) p.set_rewind_pos(*rewind_pos);
  *p.mutable_telemetry() = telemetry.ToProto();
  *p.mutable_last_gate_decision() = last_gate_decision;
  p.set_busy(busy);
  return p;
}

// ---------------------------------------------------------------------------
// SessionLease

SessionLease::SessionLease(SessionLease&& other) noexcept
    : table_(std::exchange(other.table_, nullptr)),
      record_(std::move(other.record_)) {}

SessionLease& SessionLease::operator=(SessionLease&& other) noexcept {
  if (this != &other) {
    Release();
    table_ = std::exchange(other.table_, nullptr);
    record_ = std::move(other.record_);
  }
  return *this;
}

SessionLease::~SessionLease() { Release(); }

void SessionLease::Release() { ReleaseSeeingClose(); }

bool SessionLease::ReleaseSeeingClose() {
  if (table_ == nullptr) return false;
  bool closed;
  {
    absl::MutexLock lock(&table_->mu_);
    record_->meta.busy = false;
    record_->meta.last_used = table_->options_.now();
    closed = record_->closed;
  }
  table_ = nullptr;
  record_.reset();
  return closed;
}

const std::string& SessionLease::id() const {
  CHECK(valid()) << "id() on an empty SessionLease";
  return record_->meta.id;  // immutable after Open
}

SessionSnapshot SessionLease::Snapshot() const {
  CHECK(valid());
  absl::MutexLock lock(&table_->mu_);
  return table_->SnapshotLocked(*record_);
}

std::vector<uint32_t> SessionLease::History() const {
  CHECK(valid());
  absl::MutexLock lock(&table_->mu_);
  return record_->committed;
}

bool SessionLease::closed() const {
  CHECK(valid());
  absl::MutexLock lock(&table_->mu_);
  return record_->closed;
}

void SessionLease::SetResidency(v1::Residency residency, v1::DecodeMode mode,
                                int worker) {
  CHECK(valid());
  absl::MutexLock lock(&table_->mu_);
  record_->meta.residency = residency;
  record_->meta.mode = mode;
  record_->meta.worker = worker;
  record_->meta.residency_since = table_->options_.now();
}

absl::Status SessionLease::AppendCommitted(absl::Span<const uint32_t> tokens) {
  CHECK(valid());
  absl::MutexLock lock(&table_->mu_);
  Record& r = *record_;
  if (r.committed.size() + tokens.size() > r.meta.capacity) {
    return absl::OutOfRangeError(
        absl::StrCat("session ", r.meta.id, ": committing ", tokens.size(),
                     " tokens to committed ", r.committed.size(),
                     " would pass capacity ", r.meta.capacity));
  }
  r.committed.insert(r.committed.end(), tokens.begin(), tokens.end());
  return absl::OkStatus();
}

absl::Status SessionLease::TruncateTo(uint32_t pos) {
  CHECK(valid());
  absl::MutexLock lock(&table_->mu_);
  Record& r = *record_;
  if (pos > r.committed.size()) {
    return absl::OutOfRangeError(
        absl::StrCat("session ", r.meta.id, ": cannot truncate to ", pos,
                     " past committed ", r.committed.size()));
  }
  r.committed.resize(pos);
  if (r.meta.rewind_pos.has_value() && *r.meta.rewind_pos > pos) {
    r.meta.rewind_pos.reset();
  }
  std::vector<uint32_t>& kept = r.meta.prefix_checkpoints;
  kept.erase(std::remove_if(kept.begin(), kept.end(),
                            [pos](uint32_t p) { return p > pos; }),
             kept.end());
  return absl::OkStatus();
}

void SessionLease::SetPrefixCheckpoints(absl::Span<const uint32_t> positions) {
  CHECK(valid());
  absl::MutexLock lock(&table_->mu_);
  Record& r = *record_;
  r.meta.prefix_checkpoints.clear();
  for (uint32_t p : positions) {
    if (p > 0 && p <= r.committed.size())
      r.meta.prefix_checkpoints.push_back(p);
  }
}

absl::Status SessionLease::SetRewindPos(std::optional<uint32_t> pos) {
  CHECK(valid());
  absl::MutexLock lock(&table_->mu_);
  Record& r = *record_;
  if (pos.has_value() && *pos > r.committed.size()) {
    return absl::OutOfRangeError(
        absl::StrCat("session ", r.meta.id, ": rewind position ", *pos,
                     " is past committed ", r.committed.size()));
  }
  r.meta.rewind_pos = pos;
  return absl::OkStatus();
}

void SessionLease::AddTelemetry(const v1::SessionTelemetry& delta) {
  CHECK(valid());
  absl::MutexLock lock(&table_->mu_);
  record_->meta.telemetry.Add(delta);
}

void SessionLease::SetGateDecision(const SpecGateDecision& decision) {
  CHECK(valid());
  absl::MutexLock lock(&table_->mu_);
  record_->meta.last_gate_decision = decision.ToProto();
  record_->meta.gate_state = decision.next_state;
}

void SessionLease::MarkDemoted() {
  CHECK(valid());
  absl::MutexLock lock(&table_->mu_);
  record_->meta.demoted = true;
}

// ---------------------------------------------------------------------------
// SessionTable

SessionTable::SessionTable(SessionTableOptions options)
    : options_(std::move(options)) {
  CHECK(options_.now != nullptr);
  CHECK_LE(options_.default_capacity, options_.max_capacity)
      << "default session capacity exceeds the maximum";
}

SessionSnapshot SessionTable::SnapshotLocked(const Record& r) const {
  SessionSnapshot s = r.meta;
  s.committed_len = static_cast<uint32_t>(r.committed.size());
  return s;
}

absl::StatusOr<std::shared_ptr<SessionTable::Record>> SessionTable::FindLocked(
    const std::string& id, const std::string& tenant) const {
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second->meta.tenant != tenant) {
    return NotFound(id);
  }
  return it->second;
}

absl::StatusOr<std::shared_ptr<SessionTable::Record>> SessionTable::OpenLocked(
    uint32_t capacity, const std::string& tenant) {
  if (capacity == 0) capacity = options_.default_capacity;
  if (capacity > options_.max_capacity) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session capacity ", capacity, " exceeds the model context (",
        options_.max_capacity, ")"));
  }
  if (sessions_.size() >= options_.max_sessions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session limit reached (", sessions_.size(),
                     " open); close idle sessions or retry later"));
  }
  std::string id;
  do {
    absl::StatusOr<std::string> fresh = NewSessionId();
    if (!fresh.ok()) return fresh.status();
    id = *std::move(fresh);
  } while (sessions_.contains(id));
  auto record = std::make_shared<Record>();
  record->meta.id = id;
  record->meta.tenant = tenant;
  record->meta.capacity = capacity;
  record->meta.created = record->meta.last_used = record->meta.residency_since =
      options_.now();
  sessions_.emplace(id, record);
  return record;
}

absl::StatusOr<SessionSnapshot> SessionTable::Open(uint32_t capacity,
                                                   const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::shared_ptr<Record>> record = OpenLocked(capacity, tenant);
  if (!record.ok()) return record.status();
  return SnapshotLocked(**record);
}

absl::StatusOr<SessionLease> SessionTable::OpenAndAcquire(
    uint32_t capacity, const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::shared_ptr<Record>> record = OpenLocked(capacity, tenant);
  if (!record.ok()) return record.status();
  (*record)->meta.busy = true;
  return SessionLease(this, *std::move(record));
}

absl::StatusOr<SessionSnapshot> SessionTable::Get(
    const std::string& id, const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::shared_ptr<Record>> record = FindLocked(id, tenant);
  if (!record.ok()) return record.status();
  return SnapshotLocked(**record);
}

std::vector<SessionSnapshot> SessionTable::List(
    const std::string& tenant) const {
  std::vector<SessionSnapshot> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, record] : sessions_) {
      if (record->meta.tenant == tenant) out.push_back(SnapshotLocked(*record));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const SessionSnapshot& a, const SessionSnapshot& b) {
              return a.created != b.created ? a.created < b.created
                                            : a.id < b.id;
            });
  return out;
}

absl::StatusOr<SessionTable::Closed> SessionTable::Close(
    const std::string& id, const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::shared_ptr<Record>> found = FindLocked(id, tenant);
  if (!found.ok()) return found.status();
  Record& r = **found;
  Closed closed;
  closed.was_busy = r.meta.busy;
  closed.worker = r.meta.worker;
  closed.residency = r.meta.residency;
  r.closed = true;
  r.meta.residency = v1::CLOSED;
  sessions_.erase(id);
  return closed;
}

int SessionTable::CloseAll() {
  absl::MutexLock lock(&mu_);
  const int n = static_cast<int>(sessions_.size());
  for (auto& [id, record] : sessions_) {
    record->closed = true;
    record->meta.residency = v1::CLOSED;
  }
  sessions_.clear();
  return n;
}

absl::StatusOr<SessionLease> SessionTable::Acquire(const std::string& id,
                                                   const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::shared_ptr<Record>> found = FindLocked(id, tenant);
  if (!found.ok()) return found.status();
  Record& r = **found;
  if (r.meta.busy) {
    return absl::AbortedError(
        absl::StrCat("session ", id, " already has a request in flight"));
  }
  r.meta.busy = true;
  r.meta.last_used = options_.now();
  return SessionLease(this, *std::move(found));
}

std::vector<std::string> SessionTable::MarkWorkerLost(int worker,
                                                      absl::Time as_of) {
  std::vector<std::string> lost;
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.now();
  for (auto& [id, record] : sessions_) {
    SessionSnapshot& m = record->meta;
    if (m.worker == worker && IsResident(m.residency) && !m.busy &&
        m.residency_since < as_of) {
      m.residency = v1::LOST;
      m.worker = -1;
      m.residency_since = now;
      lost.push_back(id);
    }
  }
  return lost;
}

SessionTable::Reconciled SessionTable::ReconcileWorker(
    int worker, absl::Span<const WorkerCopy> copies, absl::Time as_of) {
  Reconciled out;
  absl::flat_hash_map<std::string, v1::Residency> held;
  for (const WorkerCopy& c : copies) held[c.id] = c.residency;
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.now();
  // A record the list can speak for: idle, and unchanged since the ask.
  auto settled = [as_of](const SessionSnapshot& m) {
    return !m.busy && m.residency_since < as_of;
  };
  for (auto& [id, record] : sessions_) {
    SessionSnapshot& m = record->meta;
    if (m.worker != worker || !IsResident(m.residency) || !settled(m)) {
      continue;
    }
    auto it = held.find(id);
    if (it == held.end()) {
      m.residency = v1::LOST;
      m.worker = -1;
      m.residency_since = now;
      out.lost.push_back(id);
    } else if ((it->second == v1::PARKED || it->second == v1::OFFLOADED) &&
               it->second != m.residency) {
      m.residency = it->second;
      m.residency_since = now;
    }
  }
  for (const WorkerCopy& c : copies) {
    auto it = sessions_.find(c.id);
    if (it == sessions_.end()) continue;
    const SessionSnapshot& m = it->second->meta;
    if (settled(m) && (m.worker != worker || !IsResident(m.residency))) {
      out.abandoned.push_back(c.id);
    }
  }
  return out;
}

std::vector<SessionTable::Expired> SessionTable::ExpireIdle(
    absl::Duration idle_ttl) {
  std::vector<Expired> expired;
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.now();
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    Record& r = *it->second;
    if (!r.meta.busy && now - r.meta.last_used >= idle_ttl) {
      expired.push_back({r.meta.id, r.meta.worker, r.meta.residency});
      r.closed = true;
      r.meta.residency = v1::CLOSED;
      sessions_.erase(it++);
    } else {
      ++it;
    }
  }
  return expired;
}

size_t SessionTable::size() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

std::map<v1::Residency, int> SessionTable::CountByResidency() const {
  std::map<v1::Residency, int> counts;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, record] : sessions_) ++counts[record->meta.residency];
  return counts;
}

int SessionTable::CountPlacedOn(int worker) const {
  int n = 0;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, record] : sessions_) {
    const v1::Residency r = record->meta.residency;
    if (record->meta.worker == worker &&
        (r == v1::ACTIVE || r == v1::PARKED || r == v1::OFFLOADED)) {
      ++n;
    }
  }
  return n;
}

int SessionTable::CountOnWorker(int worker, v1::Residency residency) const {
  int n = 0;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, record] : sessions_) {
    if (record->meta.worker == worker && record->meta.residency == residency) {
      ++n;
    }
  }
  return n;
}

}  // namespace specserve::scheduler
