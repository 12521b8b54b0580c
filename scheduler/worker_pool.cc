#include "scheduler/worker_pool.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"

namespace specserve::scheduler {
namespace {

std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& address, const telemetry::ChannelSecurity& security) {
  grpc::ChannelArguments args;
  // Reconnect quickly to a restarted worker: gRPC's default maximum backoff
  // (120 s) would leave it marked unavailable for minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 64 << 20);
  return security.Dial(address, args);
}

}  // namespace

WorkerPool::WorkerPool(const std::vector<std::string>& addresses,
                       WorkerPoolOptions options,
                       WorkerSessionsListener* listener)
    : options_(options), listener_(listener) {
  for (const std::string& address : addresses) {
    auto w = std::make_unique<Worker>();
    w->address = address;
    w->channel = MakeChannel(address, options_.security);
    w->stub = specserve::worker::v1::Worker::NewStub(w->channel);
    w->health = grpc::health::v1::Health::NewStub(w->channel);
    workers_.push_back(std::move(w));
  }
  {
    absl::MutexLock lock(&mu_);
    observed_.resize(workers_.size());
    pending_release_.resize(workers_.size());
  }
  for (size_t i = 0; i < workers_.size(); ++i) {
    monitors_.emplace_back([this, i] { MonitorLoop(static_cast<int>(i)); });
  }
}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : monitors_) t.join();
}

WorkerPool::Observed WorkerPool::Poll(const Worker& w, uint64_t list_instance,
                                      uint64_t list_epoch) const {
  Observed o;
  const auto deadline = std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(options_.poll_deadline);
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status s = w.health->Check(&ctx, req, &resp);
    if (!s.ok()) {
      o.detail = "health check failed: " + s.error_message();
      // UNAVAILABLE: no connection could be made or kept (refused, reset);
      // a hung process still accepts connections and times out instead.
      o.unreachable = s.error_code() == grpc::StatusCode::UNAVAILABLE;
      o.timed_out = s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
      return o;
    }
    if (resp.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
      o.detail = "worker reports NOT_SERVING (draining)";
      o.last_seen = absl::Now();
      return o;
    }
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  specserve::worker::v1::WorkerInfoRequest req;
  req.set_claim_sessions(true);   // renews the worker's session lease
  req.set_owner(options_.owner);  // the list holds this scheduler's only
  req.set_sessions_instance(list_instance);
  req.set_sessions_epoch(list_epoch);
  grpc::Status s = w.stub->GetWorkerInfo(&ctx, req, &o.info);
  if (!s.ok()) {
    o.detail = "GetWorkerInfo failed: " + s.error_message();
    o.timed_out = s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    return o;
  }
  o.available = true;
  o.detail.clear();
  o.last_seen = absl::Now();
  return o;
}

bool WorkerPool::SendPendingReleases(int i) {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    ids.swap(pending_release_[i]);
  }
  std::vector<std::string> left;
  for (const std::string& id : ids) {
    grpc::Status s = ReleaseCall(i, id, options_.poll_deadline);
    if (s.ok() || s.error_code() == grpc::StatusCode::NOT_FOUND) {
      LOG(INFO) << "released abandoned session " << id << " on worker "
                << workers_[i]->address;
    } else {
      left.push_back(id);
    }
  }
  absl::MutexLock lock(&mu_);
  auto& pending = pending_release_[i];
  pending.insert(pending.end(), left.begin(), left.end());
  return pending.empty();
}

bool WorkerPool::PollWorker(int i) {
  uint64_t list_instance = 0, list_epoch = 0;
  absl::Time last_seen;
  {
    absl::MutexLock lock(&mu_);
    list_instance = observed_[i].list_instance;
    list_epoch = observed_[i].list_epoch;
    last_seen = observed_[i].last_seen;
  }
  const absl::Time sent = absl::Now();
  Observed o = Poll(*workers_[i], list_instance, list_epoch);
  // The listener hears first, and its releases go out, before the worker
  // can be marked available: no request places a session there while the
  // table still shows what the worker no longer holds.
  std::vector<std::string> release;
  const bool silent_too_long = o.last_seen == absl::InfinitePast() &&
                               last_seen != absl::InfinitePast() &&
                               sent - last_seen >= options_.lost_after;
  if (listener_ != nullptr && (o.unreachable || silent_too_long)) {
    release = listener_->WorkerLost(i, sent);
  } else if (listener_ != nullptr && o.info.has_session_list()) {
    release = listener_->WorkerSessions(i, sent, o.info.session_list());
  }
  if (o.info.has_session_list()) {
    o.list_instance = o.info.instance();
    o.list_epoch = o.info.pool_epoch();
    o.info.clear_session_list();  // Info() copies stay small
  } else {
    o.list_instance = list_instance;
    o.list_epoch = list_epoch;
  }
  for (const std::string& id : release) ReleaseLater(i, id);
  if (o.available && !SendPendingReleases(i)) {
    // Stay unavailable until the abandoned copies are gone (see
    // ReleaseLater).
    o.available = false;
    o.detail = "releasing sessions abandoned while it was unreachable";
  }
  absl::MutexLock lock(&mu_);
  Observed& prev = observed_[i];
  o.misses = o.timed_out ? prev.misses + 1 : 0;
  if (o.timed_out && prev.available && prev.marked_unavailable < sent &&
      o.misses < options_.down_after_misses) {
    // Slow is not down: one late answer keeps the worker, its info and its
    // work; only down_after_misses in a row take it away.
    LOG(WARNING) << "worker " << workers_[i]->address << " missed " << o.misses
                 << " health poll(s) of " << options_.down_after_misses
                 << " that mark it unavailable: " << o.detail;
    o.available = true;
    o.detail =
        absl::StrCat("missed ", o.misses, " of ", options_.down_after_misses,
                     " health polls: ", o.detail);
    o.last_seen = prev.last_seen;
    o.info = prev.info;
  }
  if (o.available && prev.marked_unavailable >= sent) {
    // A call failed while this poll was in flight: the next poll decides.
    o.available = false;
    o.detail = prev.detail;
  }
  if (prev.available != o.available) {
    LOG(INFO) << "worker " << workers_[i]->address << " is now "
              << (o.available ? "available" : "unavailable: " + o.detail);
  }
  if (!o.available && o.last_seen == absl::InfinitePast()) {
    o.last_seen = prev.last_seen;  // keep when we last heard from it
  }
  if (!o.available && !o.info.has_model()) o.info = prev.info;
  o.marked_unavailable = prev.marked_unavailable;
  const bool suspect = o.available && o.misses > 0;
  prev = std::move(o);
  return suspect;
}

void WorkerPool::MonitorLoop(int i) {
  while (true) {
    // A suspect worker is polled again at once: its next miss decides, and
    // waiting an interval first would only delay moving work off a frozen
    // worker.
    const bool suspect = PollWorker(i);
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout(
            absl::Condition(&stopping_),
            suspect ? absl::ZeroDuration() : options_.poll_interval)) {
      return;
    }
  }
}

std::vector<specserve::v1::WorkerStatus> WorkerPool::Snapshot() const {
  std::vector<specserve::v1::WorkerStatus> out;
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  for (size_t i = 0; i < workers_.size(); ++i) {
    const Observed& o = observed_[i];
    specserve::v1::WorkerStatus s;
    s.set_address(workers_[i]->address);
    s.set_available(o.available);
    s.set_device(o.info.device());
    s.set_detail(o.detail);
    *s.mutable_model() = o.info.model();
    s.set_sessions(o.info.sessions());
    s.set_last_seen_seconds_ago(o.last_seen == absl::InfinitePast()
                                    ? -1.0
                                    : absl::ToDoubleSeconds(now - o.last_seen));
    out.push_back(std::move(s));
  }
  return out;
}

bool WorkerPool::Available(int index) const {
  absl::MutexLock lock(&mu_);
  return observed_[index].available;
}

specserve::worker::v1::WorkerInfo WorkerPool::Info(int index) const {
  absl::MutexLock lock(&mu_);
  return observed_[index].info;
}

void WorkerPool::MarkUnavailable(int index, const std::string& detail) {
  absl::MutexLock lock(&mu_);
  if (observed_[index].available) {
    LOG(INFO) << "worker " << workers_[index]->address
              << " is now unavailable: " << detail;
  }
  observed_[index].available = false;
  observed_[index].detail = detail;
  observed_[index].marked_unavailable = absl::Now();
}

void WorkerPool::ReleaseLater(int index, const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  pending_release_[index].push_back(session_id);
}

int WorkerPool::NumAvailable() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const Observed& o : observed_) n += o.available ? 1 : 0;
  return n;
}

}  // namespace specserve::scheduler
