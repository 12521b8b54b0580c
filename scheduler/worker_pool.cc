#include "scheduler/worker_pool.h"

#include <chrono>

#include "glog/logging.h"
#include "grpcpp/grpcpp.h"

namespace specserve::scheduler {
namespace {

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  grpc::ChannelArguments args;
  // Reconnect quickly to a restarted worker: gRPC's default maximum backoff
  // (120 s) would leave it marked unavailable for minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 64 << 20);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   args);
}

}  // namespace

WorkerPool::WorkerPool(const std::vector<std::string>& addresses,
                       WorkerPoolOptions options)
    : options_(options) {
  for (const std::string& address : addresses) {
    auto w = std::make_unique<Worker>();
    w->address = address;
    w->channel = MakeChannel(address);
    w->stub = specserve::worker::v1::Worker::NewStub(w->channel);
    w->health = grpc::health::v1::Health::NewStub(w->channel);
    workers_.push_back(std::move(w));
  }
  {
    absl::MutexLock lock(&mu_);
    observed_.resize(workers_.size());
    pending_release_.resize(workers_.size());
  }
  monitor_ = std::thread([this] { MonitorLoop(); });
}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  monitor_.join();
}

WorkerPool::Observed WorkerPool::Poll(const Worker& w) const {
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
  grpc::Status s = w.stub->GetWorkerInfo(
      &ctx, specserve::worker::v1::WorkerInfoRequest(), &o.info);
  if (!s.ok()) {
    o.detail = "GetWorkerInfo failed: " + s.error_message();
    return o;
  }
  o.available = true;
  o.detail.clear();
  o.last_seen = absl::Now();
  return o;
}

namespace {

grpc::ClientContext* WithTimeout(grpc::ClientContext* ctx,
                                 absl::Duration timeout) {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    absl::ToChronoMilliseconds(timeout));
  return ctx;
}

specserve::worker::v1::SessionRef Ref(const std::string& session_id) {
  specserve::worker::v1::SessionRef ref;
  ref.set_session_id(session_id);
  return ref;
}

}  // namespace

grpc::Status WorkerPool::Release(int index, const std::string& session_id,
                                 absl::Duration timeout) const {
  grpc::ClientContext ctx;
  specserve::worker::v1::ReleaseResponse rr;
  return workers_[index]->stub->Release(WithTimeout(&ctx, timeout),
                                        Ref(session_id), &rr);
}

void WorkerPool::ReleaseNowOrLater(int index, const std::string& session_id) {
  grpc::Status s(grpc::StatusCode::UNAVAILABLE, "worker unavailable");
  if (Available(index)) s = Release(index, session_id, absl::Seconds(5));
  if (!s.ok() && s.error_code() != grpc::StatusCode::NOT_FOUND) {
    ReleaseLater(index, session_id);
  }
}

grpc::Status WorkerPool::Park(int index, const std::string& session_id,
                              absl::Duration timeout,
                              specserve::worker::v1::SessionState* state) const {
  grpc::ClientContext ctx;
  return workers_[index]->stub->Park(WithTimeout(&ctx, timeout),
                                     Ref(session_id), state);
}

grpc::Status WorkerPool::Demote(int index, const std::string& session_id,
                                absl::Duration timeout,
                                specserve::worker::v1::SessionState* state) const {
  grpc::ClientContext ctx;
  return workers_[index]->stub->Demote(WithTimeout(&ctx, timeout),
                                       Ref(session_id), state);
}

bool WorkerPool::SendPendingReleases(int i) {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    ids.swap(pending_release_[i]);
  }
  std::vector<std::string> left;
  for (const std::string& id : ids) {
    grpc::Status s = Release(i, id, options_.poll_deadline);
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

void WorkerPool::PollOnce() {
  for (size_t i = 0; i < workers_.size(); ++i) {
    Observed o = Poll(*workers_[i]);
    if (o.available && !SendPendingReleases(static_cast<int>(i))) {
      // Stay unavailable until the abandoned copies are gone (see
      // ReleaseLater).
      o.available = false;
      o.detail = "releasing sessions abandoned while it was unreachable";
    }
    absl::MutexLock lock(&mu_);
    Observed& prev = observed_[i];
    if (prev.available != o.available) {
      LOG(INFO) << "worker " << workers_[i]->address << " is now "
                << (o.available ? "available" : "unavailable: " + o.detail);
    }
    if (!o.available && o.last_seen == absl::InfinitePast()) {
      o.last_seen = prev.last_seen;  // keep when we last heard from it
    }
    if (!o.available && !o.info.has_model()) o.info = prev.info;
    prev = std::move(o);
  }
}

void WorkerPool::MonitorLoop() {
  while (true) {
    PollOnce();
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                             options_.poll_interval)) {
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
