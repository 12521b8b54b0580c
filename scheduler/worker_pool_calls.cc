// WorkerPool's session calls (scheduler/worker_pool.h): unary calls run on a
// completion queue of their own and watched like bursts, so a call to a
// worker that hangs ends as soon as the monitor marks it unavailable.
#include <chrono>
#include <functional>
#include <memory>

#include "glog/logging.h"
#include "grpcpp/grpcpp.h"
#include "scheduler/worker_pool.h"

namespace specserve::scheduler {
namespace {

namespace wv1 = specserve::worker::v1;

// How often a watched call checks its worker while no answer has come.
constexpr auto kWatchInterval = std::chrono::milliseconds(20);

template <typename Response>
using Reader = std::unique_ptr<grpc::ClientAsyncResponseReader<Response>>;

// Runs the call `prepare` sets up on `ctx` until it ends, or until
// `worker_down()` holds: then it is cancelled and fails UNAVAILABLE.
template <typename Response>
grpc::Status Watched(
    grpc::ClientContext* ctx,
    const std::function<Reader<Response>(grpc::CompletionQueue*)>& prepare,
    Response* response, const std::function<bool()>& worker_down) {
  grpc::CompletionQueue cq;
  Reader<Response> reader = prepare(&cq);
  reader->StartCall();
  grpc::Status status;
  void* const finish_tag = reinterpret_cast<void*>(1);
  reader->Finish(response, &status, finish_tag);
  bool gave_up = false;
  while (true) {
    void* tag = nullptr;
    bool ok = false;
    const auto next = cq.AsyncNext(
        &tag, &ok, std::chrono::system_clock::now() + kWatchInterval);
    if (next == grpc::CompletionQueue::GOT_EVENT) break;
    CHECK(next == grpc::CompletionQueue::TIMEOUT) << "call queue shut down";
    if (!gave_up && worker_down()) {
      gave_up = true;
      ctx->TryCancel();  // Finish still comes, with CANCELLED
    }
  }
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  if (gave_up && !status.ok()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "the worker stopped answering during the call");
  }
  return status;
}

void SetDeadline(grpc::ClientContext* ctx, absl::Time deadline) {
  if (deadline != absl::InfiniteFuture()) {
    ctx->set_deadline(absl::ToChronoTime(deadline));
  }
}

wv1::SessionRef Ref(const std::string& session_id, const std::string& owner) {
  wv1::SessionRef ref;
  ref.set_session_id(session_id);
  ref.set_owner(owner);
  return ref;
}

}  // namespace

grpc::Status WorkerPool::Admit(int index, const wv1::AdmitRequest& request,
                               absl::Time deadline, wv1::SessionState* state) {
  DCHECK_EQ(request.owner(), options_.owner) << "an admit without our owner";
  grpc::ClientContext ctx;
  SetDeadline(&ctx, deadline);
  wv1::Worker::Stub* stub = workers_[index]->stub.get();
  grpc::Status s = Watched<wv1::SessionState>(
      &ctx,
      [&](grpc::CompletionQueue* cq) {
        return stub->PrepareAsyncAdmit(&ctx, request, cq);
      },
      state, [this, index] { return !Available(index); });
  const grpc::StatusCode code = s.error_code();
  if (code == grpc::StatusCode::UNAVAILABLE ||
      code == grpc::StatusCode::DEADLINE_EXCEEDED ||
      code == grpc::StatusCode::CANCELLED) {
    // The worker may still create the copy once it runs again; nothing
    // would ever use or free it.
    ReleaseNowOrLater(index, request.session_id());
  }
  return s;
}

grpc::Status WorkerPool::ReleaseCall(int index, const std::string& session_id,
                                     absl::Duration timeout) const {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Now() + timeout);
  wv1::ReleaseResponse rr;
  return workers_[index]->stub->Release(&ctx, Ref(session_id, options_.owner),
                                        &rr);
}

grpc::Status WorkerPool::Release(int index, const std::string& session_id,
                                 absl::Duration timeout) const {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Now() + timeout);
  wv1::Worker::Stub* stub = workers_[index]->stub.get();
  const wv1::SessionRef ref = Ref(session_id, options_.owner);
  wv1::ReleaseResponse rr;
  return Watched<wv1::ReleaseResponse>(
      &ctx,
      [&](grpc::CompletionQueue* cq) {
        return stub->PrepareAsyncRelease(&ctx, ref, cq);
      },
      &rr, [this, index] { return !Available(index); });
}

void WorkerPool::ReleaseNowOrLater(int index, const std::string& session_id) {
  grpc::Status s(grpc::StatusCode::UNAVAILABLE, "worker unavailable");
  if (Available(index)) s = Release(index, session_id, absl::Seconds(5));
  if (!s.ok() && s.error_code() != grpc::StatusCode::NOT_FOUND) {
    ReleaseLater(index, session_id);
  }
}

grpc::Status WorkerPool::SessionStateCall(int index,
                                          const std::string& session_id,
                                          absl::Duration timeout,
                                          wv1::SessionState* state,
                                          PrepareSessionCall prepare) const {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Now() + timeout);
  wv1::Worker::Stub* stub = workers_[index]->stub.get();
  const wv1::SessionRef ref = Ref(session_id, options_.owner);
  return Watched<wv1::SessionState>(
      &ctx,
      [&](grpc::CompletionQueue* cq) {
        return (stub->*prepare)(&ctx, ref, cq);
      },
      state, [this, index] { return !Available(index); });
}

grpc::Status WorkerPool::Park(int index, const std::string& session_id,
                              absl::Duration timeout,
                              wv1::SessionState* state) const {
  return SessionStateCall(index, session_id, timeout, state,
                          &wv1::Worker::Stub::PrepareAsyncPark);
}

grpc::Status WorkerPool::Demote(int index, const std::string& session_id,
                                absl::Duration timeout,
                                wv1::SessionState* state) const {
  return SessionStateCall(index, session_id, timeout, state,
                          &wv1::Worker::Stub::PrepareAsyncDemote);
}

}  // namespace specserve::scheduler
