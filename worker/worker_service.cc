#include "worker/worker_service.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/sampling/sampling.h"
#include "telemetry/constant_time.h"
#include "telemetry/grpc_reactors.h"
#include "telemetry/server_lifecycle.h"
#include "telemetry/status_macros.h"
#include "telemetry/stream_reactor.h"
#include "worker/burst_request.h"
#include "worker/model_files/checkpoint.h"
#include "worker/model_info.h"
#include "worker/session_state.h"

namespace specserve::worker {

using specserve::worker::v1::BurstEvent;
using specserve::worker::v1::SessionState;
using telemetry::FinishUnary;
using telemetry::ToGrpc;

// Consecutive token events waiting behind an in-flight write travel as one.
class BurstWriter final : public telemetry::StreamReactor<BurstEvent> {
 protected:
  bool Merge(BurstEvent* into, const BurstEvent& next) override {
    if (!into->has_tokens() || !next.has_tokens()) return false;
    into->mutable_tokens()->mutable_ids()->MergeFrom(next.tokens().ids());
    into->mutable_logprobs()->MergeFrom(next.logprobs());
    return true;
  }
};

namespace {

// Errors after which a session's caches cannot be trusted: it is dropped,
// not parked (docs/RELIABILITY.md row 8). Validation errors leave it untouched.
bool LeavesSessionInconsistent(const absl::Status& s) {
  return s.code() == absl::StatusCode::kInternal ||
         s.code() == absl::StatusCode::kUnknown ||
         s.code() == absl::StatusCode::kDataLoss;
}

void LogprobsToProto(const spec::TokenLogprobs& lp,
                     specserve::v1::TokenLogprobs* out) {
  out->set_id(lp.id);
  out->set_logprob(lp.logprob);
  out->mutable_top_ids()->Add(lp.top_ids.begin(), lp.top_ids.end());
  out->mutable_top_logprobs()->Add(lp.top_logprobs.begin(),
                                   lp.top_logprobs.end());
}

specserve::worker::v1::BurstEnd EndToProto(spec::BurstEnd end) {
  switch (end) {
    case spec::BurstEnd::kMaxNew:
      return specserve::worker::v1::MAX_NEW;
    case spec::BurstEnd::kStopToken:
      return specserve::worker::v1::STOP_TOKEN;
    case spec::BurstEnd::kCapacity:
      return specserve::worker::v1::CAPACITY;
    case spec::BurstEnd::kCancelled:
      return specserve::worker::v1::CANCELLED;
  }
  return specserve::worker::v1::BURST_END_UNSPECIFIED;
}

}  // namespace

WorkerService::WorkerService(WorkerOptions options, model::Model* model)
    : options_(std::move(options)),
      model_(model),
      model_info_(DescribeModel(model->checkpoint())),
      instance_((uint64_t{std::random_device{}()} << 32) |
                std::random_device{}()),
      live_costs_(
          options_.live_costs
              ? std::make_unique<spec::LiveStepCosts>(
                    std::vector<double>(
                        options_.costs.decode_seconds_by_batch().begin(),
                        options_.costs.decode_seconds_by_batch().end()),
                    std::vector<double>(
                        options_.costs.verify_seconds_by_columns().begin(),
                        options_.costs.verify_seconds_by_columns().end()))
              : nullptr),
      executor_(model),
      engine_(&executor_, options_.prefix_checkpoints),
      pool_(options_.pool, &executor_),
      lease_(options_.session_lease, [this] { return pool_.ReleaseIdle(); }) {
  executor_.set_live_costs(live_costs_.get());
}

SessionState WorkerService::StateOf(const spec::SpecSession& s, bool busy) {
  specserve::worker::v1::WorkerResidency r = specserve::worker::v1::RESIDENT;
  if (!busy) {
    auto pr = pool_.ResidencyOf(s.id());
    r = pr.ok() && *pr == Residency::kOffloaded
            ? specserve::worker::v1::OFFLOADED
            : specserve::worker::v1::PARKED;
  }
  return SessionStateToProto(s, r, pool_.BytesOf(s));
}

grpc::ServerUnaryReactor* WorkerService::GetWorkerInfo(
    grpc::CallbackServerContext* ctx,
    const specserve::worker::v1::WorkerInfoRequest* request,
    specserve::worker::v1::WorkerInfo* response) {
  if (request->claim_sessions()) lease_.Renew();
  const SessionPool::Stats stats = pool_.stats();
  response->set_device(options_.device);
  *response->mutable_model() = model_info_;
  response->set_default_capacity(options_.default_capacity);
  response->set_memory_budget_bytes(pool_.device_budget_bytes());
  response->set_memory_used_bytes(stats.device_bytes);
  response->set_host_memory_used_bytes(stats.host_bytes);
  response->set_sessions(stats.sessions);
  response->set_active_bursts(active_bursts_.load());
  if (live_costs_ != nullptr) {
    const spec::LiveStepCosts::Table t = live_costs_->Snapshot();
    auto* costs = response->mutable_costs();
    costs->mutable_decode_seconds_by_batch()->Add(
        t.decode_seconds_by_batch.begin(), t.decode_seconds_by_batch.end());
    costs->mutable_verify_seconds_by_columns()->Add(
        t.round_seconds_by_columns.begin(), t.round_seconds_by_columns.end());
  } else {
    *response->mutable_costs() = options_.costs;
  }
  response->set_pid(static_cast<uint32_t>(getpid()));
  response->set_instance(instance_);
  // The list is read with its epoch, so the pair describes one moment: a
  // caller that stores both asks again only after the next change. While the
  // pool is held (a budget pass can take seconds) no list is sent and the
  // caller keeps what it has: this poll is the scheduler's liveness check
  // and must not wait on the pool.
  std::optional<SessionPool::Listing> listing = pool_.TryList();
  const bool same_instance = request->sessions_instance() == instance_;
  uint64_t epoch = listing         ? listing->epoch
                   : same_instance ? request->sessions_epoch()
                                   : 0;
  if (listing && (!same_instance || request->sessions_epoch() != epoch)) {
    auto* list = response->mutable_session_list();
    for (const SessionPool::Listed& l : listing->sessions) {
      // Another owner's session ids are not the caller's to know.
      if (!telemetry::ConstantTimeEquals(l.owner, request->owner())) continue;
      auto* e = list->add_sessions();
      e->set_session_id(l.id);
      e->set_residency(l.busy ? specserve::worker::v1::RESIDENT
                       : l.residency == Residency::kOffloaded
                           ? specserve::worker::v1::OFFLOADED
                           : specserve::worker::v1::PARKED);
    }
  }
  response->set_pool_epoch(epoch);
  return FinishUnary(ctx, grpc::Status::OK);
}

absl::StatusOr<int> WorkerService::NewSessionCapacity(
    uint32_t requested) const {
  const int capacity =
      requested > 0 ? static_cast<int>(requested) : options_.default_capacity;
  const int max_context = model_->config().max_position_embeddings;
  if (capacity > max_context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "capacity ", capacity, " exceeds the model context of ", max_context));
  }
  return capacity;
}

grpc::Status WorkerService::Draining() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "worker is draining: no new work accepted");
}

grpc::ServerUnaryReactor* WorkerService::Admit(
    grpc::CallbackServerContext* ctx,
    const specserve::worker::v1::AdmitRequest* request,
    SessionState* response) {
  lease_.Renew();
  if (telemetry::DrainRequested()) return FinishUnary(ctx, Draining());
  const absl::StatusOr<int> capacity = NewSessionCapacity(request->capacity());
  if (!capacity.ok()) return FinishUnary(ctx, ToGrpc(capacity.status()));
  if (absl::Status s = CheckAdmitLimits(*request); !s.ok()) {
    return FinishUnary(ctx, ToGrpc(s));
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  std::thread([this, ctx, reactor, request, response, capacity = *capacity] {
    std::vector<int32_t> history(request->history().begin(),
                                 request->history().end());
    auto session = engine_.Admit(
        request->session_id(), capacity, history,
        request->has_checkpoint_pos()
            ? std::optional<int>(static_cast<int>(request->checkpoint_pos()))
            : std::nullopt,
        request->speculative(), DraftDepthOf(*request),
        static_cast<int>(std::min<uint32_t>(request->prompt_rows(), capacity)));
    if (!session.ok()) {
      reactor->Finish(ToGrpc(session.status()));
      return;
    }
    {
      auto lease = pool_.Insert(std::move(*session), request->owner());
      if (!lease.ok()) {
        reactor->Finish(ToGrpc(lease.status()));
        return;
      }
      *response = StateOf(*lease->get(), /*busy=*/true);
    }
    if (ctx->IsCancelled()) {
      // The scheduler gave up on this admit (the worker looked hung, or the
      // deadline passed) and never learns of the copy: free it now, or it
      // stays in the pool for good.
      pool_.Release(request->session_id(), request->owner()).IgnoreError();
      reactor->Finish(
          grpc::Status(grpc::StatusCode::CANCELLED, "admit cancelled"));
      return;
    }
    // The lease went back to the pool BEFORE answering: the scheduler's next
    // call (a Burst) may arrive as soon as it has the answer, and must not
    // find the session still leased (ABORTED "already running a request").
    reactor->Finish(grpc::Status::OK);
  }).detach();
  return reactor;
}

grpc::ServerWriteReactor<BurstEvent>* WorkerService::Burst(
    grpc::CallbackServerContext* ctx,
    const specserve::worker::v1::BurstRequest* request) {
  using Refused = telemetry::FinishedWriteReactor<BurstEvent>;
  lease_.Renew();
  if (telemetry::DrainRequested()) return new Refused(Draining());
  if (absl::Status s = CheckBurstLimits(*request); !s.ok()) {
    return new Refused(ToGrpc(s));
  }
  auto* writer = new BurstWriter();
  // The session is taken on the burst's own thread, never in this reaction:
  // Acquire restores an offloaded session (waiting for the model) and waits
  // while a budget pass holds the pool, and a reaction that blocks holds one
  // of gRPC's callback threads, which also answer Health and GetWorkerInfo,
  // the scheduler's liveness polls (a busy worker must not look down).
  std::thread([this, ctx, req = *request, writer]() mutable {
    telemetry::InFlightGuard in_flight;
    auto refuse = [writer](grpc::Status status) {
      writer->Finish(std::move(status));
      writer->Done();
    };
    auto lease = pool_.Acquire(req.session_id(), req.owner());
    if (!lease.ok()) return refuse(ToGrpc(lease.status()));
    if (req.has_expect_history_len()) {
      // The integrity guard (proto/worker.proto): a copy that is not what
      // the scheduler's history says is refused before anything touches it.
      const spec::SpecSession& s = *lease->get();
      const uint32_t holds = s.committed_len() + (s.has_pending() ? 1 : 0);
      if (holds != req.expect_history_len()) {
        return refuse(grpc::Status(
            grpc::StatusCode::FAILED_PRECONDITION,
            absl::StrCat("session ", req.session_id(), " holds ", holds,
                         " tokens of history here, the caller expects ",
                         req.expect_history_len(),
                         ": rebuild it from its history")));
      }
    }
    auto stop = std::make_shared<std::atomic<bool>>(false);
    {
      absl::MutexLock lock(&stops_mu_);
      stops_[req.session_id()] = RunningBurst{stop, req.owner()};
    }
    RunBurst(ctx, std::move(req), std::move(*lease), writer, std::move(stop));
  }).detach();
  return writer;
}

grpc::ServerUnaryReactor* WorkerService::StopBurst(
    grpc::CallbackServerContext* ctx,
    const specserve::worker::v1::SessionRef* request,
    specserve::worker::v1::StopBurstResponse*) {
  lease_.Renew();
  bool running = false;
  {
    absl::MutexLock lock(&stops_mu_);
    auto it = stops_.find(request->session_id());
    if (it != stops_.end() &&
        telemetry::ConstantTimeEquals(it->second.owner, request->owner())) {
      it->second.stop->store(true);
      running = true;
    }
  }
  if (!running) {
    return FinishUnary(
        ctx, grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("no burst of session ",
                                       request->session_id(), " is running")));
  }
  return FinishUnary(ctx, grpc::Status::OK);
}

void WorkerService::RunBurst(grpc::CallbackServerContext* ctx,
                             specserve::worker::v1::BurstRequest request,
                             SessionPool::Lease lease, BurstWriter* writer,
                             StopFlag stop) {
  telemetry::InFlightGuard in_flight;
  ++active_bursts_;
  const auto deadline = ctx->deadline();
  bool deadline_passed = false;
  absl::Status status;
  spec::BurstResult result;
  absl::StatusOr<spec::BurstParams> params = BurstParamsOf(
      request, options_.enable_fault_injection, options_.grammars.get());
  if (!params.ok()) {
    status = params.status();
  } else {
    const spec::BurstParams& p = *params;
    auto r = engine_.RunBurst(
        lease.get(), p,
        [&](absl::Span<const int32_t> t,
            absl::Span<const spec::TokenLogprobs> lps) {
          BurstEvent e;
          e.mutable_tokens()->mutable_ids()->Add(t.begin(), t.end());
          for (const spec::TokenLogprobs& lp : lps) {
            LogprobsToProto(lp, e.add_logprobs());
          }
          if (!writer->Write(std::move(e))) return false;
          // Checked after the tokens are written: a stopped burst streams
          // every token it committed, then its summary.
          if (stop->load()) return false;
          if (std::chrono::system_clock::now() > deadline) {
            deadline_passed = true;
            return false;
          }
          return true;
        });
    status = r.status();
    if (r.ok()) result = *r;
  }
  // The session goes back to the pool (or is dropped) BEFORE the call
  // finishes: the scheduler's next call on it (Park, Demote, Release, the
  // next Burst) may arrive as soon as it sees the status, and must not find
  // it still leased.
  grpc::Status final_status = grpc::Status::OK;
  if (!status.ok()) {
    if (LeavesSessionInconsistent(status)) lease.Discard();
    final_status = ToGrpc(status);
  } else if (deadline_passed) {
    final_status = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                "deadline passed during the burst");
  } else {
    BurstEvent e;
    auto* summary = e.mutable_summary();
    summary->set_end(EndToProto(result.end));
    summary->set_overshoot(result.overshoot);
    *summary->mutable_telemetry_delta() = result.telemetry_delta.ToProto();
    *summary->mutable_state() = StateOf(*lease.get(), /*busy=*/true);
    summary->set_cached_tokens(result.cached_tokens);
    for (const spec::TokenLogprobs& lp : result.prompt_logprobs) {
      LogprobsToProto(lp, summary->add_prompt_logprobs());
    }
    writer->Write(std::move(e));
  }
  {
    absl::MutexLock lock(&stops_mu_);
    auto it = stops_.find(request.session_id());
    if (it != stops_.end() && it->second.stop == stop) stops_.erase(it);
  }
  { SessionPool::Lease done = std::move(lease); }  // back to the pool first
  --active_bursts_;
  writer->Finish(final_status);
  writer->Done();
}

grpc::ServerUnaryReactor* WorkerService::RunSessionOp(
    grpc::CallbackServerContext* ctx,
    const specserve::worker::v1::SessionRef& ref, SessionState* response,
    SessionOp op, bool idle_residency) {
  lease_.Renew();
  const std::string session_id = ref.session_id();
  const std::string owner = ref.owner();
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  // Acquired on the op's thread, not in the reaction (see Burst).
  std::thread([this, reactor, response, op = std::move(op), session_id, owner,
               idle_residency]() mutable {
    auto acquired = pool_.Acquire(session_id, owner);
    if (!acquired.ok()) {
      reactor->Finish(ToGrpc(acquired.status()));
      return;
    }
    SessionPool::Lease lease = std::move(*acquired);
    absl::Status s = op(lease.get());
    if (s.ok()) *response = StateOf(*lease.get(), /*busy=*/true);
    if (LeavesSessionInconsistent(s)) lease.Discard();
    { SessionPool::Lease done = std::move(lease); }
    if (s.ok() && idle_residency) {
      // Returning the lease enforced the memory budgets: report where the
      // session went (the scheduler shows it in GetSession), or that it is
      // gone (the scheduler then marks it LOST right away).
      auto where = pool_.ResidencyOf(session_id);
      if (!where.ok()) {
        s = absl::NotFoundError(absl::StrCat(
            "session ", session_id,
            " was evicted under memory pressure as it was parked"));
      } else {
        response->set_residency(*where == Residency::kOffloaded
                                    ? specserve::worker::v1::OFFLOADED
                                    : specserve::worker::v1::PARKED);
      }
    }
    reactor->Finish(ToGrpc(s));
  }).detach();
  return reactor;
}

grpc::ServerUnaryReactor* WorkerService::Flush(
    grpc::CallbackServerContext* ctx,
    const specserve::worker::v1::SessionRef* request, SessionState* response) {
  return RunSessionOp(ctx, *request, response, [this](spec::SpecSession* s) {
    return engine_.Flush(s);
  });
}

grpc::ServerUnaryReactor* WorkerService::Park(
    grpc::CallbackServerContext* ctx,
    const specserve::worker::v1::SessionRef* request, SessionState* response) {
  // Parked sessions are flushed (with next_pred) so any later request can
  // resume them; the pool may then offload them under pressure.
  return RunSessionOp(
      ctx, *request, response,
      [this](spec::SpecSession* s) { return engine_.Flush(s); },
      /*idle_residency=*/true);
}

grpc::ServerUnaryReactor* WorkerService::Resume(
    grpc::CallbackServerContext* ctx,
    const specserve::worker::v1::SessionRef* request, SessionState* response) {
  // Acquire restores offloaded caches; a new request gets one fresh
  // draft-graph capture chance.
  return RunSessionOp(ctx, *request, response, [](spec::SpecSession* s) {
    s->reset_graph_fallback_on_resume();
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* WorkerService::Rewind(
    grpc::CallbackServerContext* ctx,
    const specserve::worker::v1::SessionRef* request, SessionState* response) {
  return RunSessionOp(ctx, *request, response, [this](spec::SpecSession* s) {
    return engine_.Rewind(s);
  });
}

grpc::ServerUnaryReactor* WorkerService::Demote(
    grpc::CallbackServerContext* ctx,
    const specserve::worker::v1::SessionRef* request, SessionState* response) {
  return RunSessionOp(ctx, *request, response, [this](spec::SpecSession* s) {
    return engine_.Demote(s);
  });
}

grpc::ServerUnaryReactor* WorkerService::GetSessionState(
    grpc::CallbackServerContext* ctx,
    const specserve::worker::v1::SessionRef* request, SessionState* response) {
  return RunSessionOp(ctx, *request, response,
                      [](spec::SpecSession*) { return absl::OkStatus(); });
}

grpc::ServerUnaryReactor* WorkerService::Release(
    grpc::CallbackServerContext* ctx,
    const specserve::worker::v1::SessionRef* request,
    specserve::worker::v1::ReleaseResponse*) {
  lease_.Renew();
  // On a thread of its own: the pool may be held by a budget pass (see
  // Burst).
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  std::thread([this, reactor, id = request->session_id(),
               owner = request->owner()] {
    reactor->Finish(ToGrpc(pool_.Release(id, owner)));
  }).detach();
  return reactor;
}

grpc::ServerUnaryReactor* WorkerService::LoadModel(
    grpc::CallbackServerContext* ctx,
    const specserve::worker::v1::LoadModelRequest* request,
    specserve::worker::v1::LoadModelResponse*) {
  if (request->model_dir().empty()) {
    return FinishUnary(ctx, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                         "LoadModel: model_dir is empty"));
  }
  // The same checks as start-up (memory-mapped: no weights are copied).
  auto checkpoint = model_files::Checkpoint::Open(request->model_dir());
  if (!checkpoint.ok()) {
    return FinishUnary(
        ctx, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("cannot load ", request->model_dir(),
                                       ": ", checkpoint.status().message())));
  }
  if (!request->validate_only()) {
    if (!options_.on_load_model) {
      return FinishUnary(ctx,
                         grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                      "this worker cannot switch models"));
    }
    options_.on_load_model(request->model_dir());
  }
  return FinishUnary(ctx, grpc::Status::OK);
}

}  // namespace specserve::worker
