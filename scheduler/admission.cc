#include "scheduler/admission.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace specserve::scheduler {

// ---------------------------------------------------------------------------
// AdmissionTicket

AdmissionTicket::AdmissionTicket(AdmissionTicket&& other) noexcept
    : controller_(std::exchange(other.controller_, nullptr)),
      id_(std::exchange(other.id_, 0)) {}

AdmissionTicket& AdmissionTicket::operator=(AdmissionTicket&& other) noexcept {
  if (this != &other) {
    Release();
    controller_ = std::exchange(other.controller_, nullptr);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

AdmissionTicket::~AdmissionTicket() { Release(); }

bool AdmissionTicket::running() const {
  return controller_ != nullptr && controller_->IsRunning(id_);
}

absl::Status AdmissionTicket::Wait(absl::Time deadline,
                                   std::function<bool()> cancelled) {
  CHECK(controller_ != nullptr) << "Wait on an empty AdmissionTicket";
  return controller_->Wait(id_, deadline, cancelled);
}

void AdmissionTicket::Cancel() {
  if (controller_ != nullptr) controller_->Cancel(id_);
}

void AdmissionTicket::Release() {
  if (controller_ == nullptr) return;
  controller_->Release(id_);
  controller_ = nullptr;
  id_ = 0;
}

// ---------------------------------------------------------------------------
// AdmissionController

AdmissionController::AdmissionController(AdmissionOptions options)
    : options_(std::move(options)) {
  CHECK_GT(options_.max_running, 0) << "max_running must be positive";
  CHECK_GE(options_.max_queued, 0) << "max_queued must be >= 0";
  CHECK(options_.now != nullptr);
}

AdmissionController::~AdmissionController() {
  absl::MutexLock lock(&mu_);
  DCHECK(entries_.empty()) << entries_.size()
                           << " admission tickets outlive their controller";
}

absl::StatusOr<AdmissionTicket> AdmissionController::TryAdmit() {
  absl::MutexLock lock(&mu_);
  // A free slot with a non-empty queue cannot happen (eager promotion), so a
  // free slot means nobody is ahead of us.
  if (running_ < options_.max_running) {
    DCHECK(queue_.empty());
    const uint64_t id = next_id_++;
    entries_[id] = Entry{/*running=*/true, /*cancelled=*/false, options_.now()};
    ++running_;
    return AdmissionTicket(this, id);
  }
  if (static_cast<int>(queue_.size()) < options_.max_queued) {
    const uint64_t id = next_id_++;
    entries_[id] = Entry{};
    queue_.push_back(id);
    return AdmissionTicket(this, id);
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("server busy: ", running_, " requests running, ",
                   queue_.size(), " queued; retry after ~",
                   absl::ToInt64Milliseconds(RetryHintLocked()), " ms"));
}

bool AdmissionController::IsRunning(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  return it != entries_.end() && it->second.running;
}

absl::Status AdmissionController::Wait(uint64_t id, absl::Time deadline,
                                       const std::function<bool()>& cancelled) {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto it = entries_.find(id);
    CHECK(it != entries_.end()) << "Wait on a released admission ticket";
    // Cancellation wins over a promotion that raced with it. The predicate
    // runs under mu_: it must be cheap and must not call back into this
    // controller (ServerContext::IsCancelled qualifies).
    if (it->second.cancelled || (cancelled && cancelled())) {
      it->second.cancelled = true;
      return absl::CancelledError(
          "request cancelled while queued for admission");
    }
    if (it->second.running) return absl::OkStatus();
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      const auto pos = std::find(queue_.begin(), queue_.end(), id);
      return absl::DeadlineExceededError(
          absl::StrCat("deadline passed while queued for admission (position ",
                       pos - queue_.begin() + 1, " of ", queue_.size(), ")"));
    }
    changed_.WaitWithDeadline(&mu_,
                              std::min(deadline, now + options_.poll_interval));
  }
}

void AdmissionController::Cancel(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  it->second.cancelled = true;
  changed_.SignalAll();
}

void AdmissionController::Release(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  CHECK(it != entries_.end()) << "admission ticket released twice";
  if (it->second.running) {
    --running_;
    RecordDurationLocked(options_.now() - it->second.started);
  } else {
    auto pos = std::find(queue_.begin(), queue_.end(), id);
    CHECK(pos != queue_.end()) << "queued admission ticket missing from queue";
    queue_.erase(pos);
  }
  entries_.erase(it);
  PromoteLocked();
  changed_.SignalAll();
}

void AdmissionController::PromoteLocked() {
  while (running_ < options_.max_running && !queue_.empty()) {
    const uint64_t id = queue_.front();
    queue_.pop_front();
    Entry& e = entries_.at(id);
    e.running = true;
    e.started = options_.now();
    ++running_;
  }
}

void AdmissionController::RecordDurationLocked(absl::Duration d) {
  if (d < absl::ZeroDuration()) d = absl::ZeroDuration();
  durations_.push_back(d);
  durations_sum_ += d;
  while (static_cast<int>(durations_.size()) > std::max(1, options_.history)) {
    durations_sum_ -= durations_.front();
    durations_.pop_front();
  }
}

absl::Duration AdmissionController::RetryHintLocked() const {
  if (running_ < options_.max_running) return absl::ZeroDuration();
  const absl::Duration mean =
      durations_.empty()
          ? options_.initial_request_estimate
          : durations_sum_ / static_cast<int64_t>(durations_.size());
  // Slots free at about max_running per mean duration; a new request would
  // start after everyone queued ahead of it, plus itself.
  const absl::Duration wait =
      mean * static_cast<int64_t>(queue_.size() + 1) / options_.max_running;
  return std::max(wait, absl::Milliseconds(10));
}

absl::Duration AdmissionController::RetryHint() const {
  absl::MutexLock lock(&mu_);
  return RetryHintLocked();
}

int AdmissionController::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

int AdmissionController::queued() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(queue_.size());
}

}  // namespace specserve::scheduler
