#include "scheduler/generate_call.h"

#include <algorithm>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "scheduler/burst_client.h"
#include "scheduler/idle_poller.h"
#include "scheduler/output_stream.h"
#include "scheduler/placement.h"
#include "scheduler/prefix_reuse.h"
#include "scheduler/worker_wait.h"
#include "telemetry/grpc_reactors.h"
#include "telemetry/server_lifecycle.h"
#include "telemetry/status_macros.h"

namespace specserve::scheduler {
namespace {

using specserve::v1::FinishReason;
using specserve::v1::GenerateEvent;
using specserve::v1::GenerateRequest;
using specserve::worker::v1::BurstSummary;

uint64_t RandomU64() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng() | 1;  // never 0, which means "unset"
}

std::string NewRequestId() {
  return absl::StrCat("req_", absl::Hex(RandomU64(), absl::kZeroPad16));
}

// Everything one request carries between its steps.
class Call {
 public:
  Call(SchedulerContext* ctx, const GenerateRequest& request,
       std::string tenant, absl::Time deadline, GenerateWriter* out,
       uint32_t inject_nan_at)
      : ctx_(ctx),
        req_(request),
        tenant_(std::move(tenant)),
        deadline_(deadline),
        out_(out),
        inject_nan_at_(inject_nan_at) {}

  grpc::Status Run(AdmissionTicket ticket);

 private:
  bool Cancelled() const {
    return (cancel_ != nullptr && cancel_->load()) || out_->cancelled();
  }
  // The model's EOS ids end the output unless ignore_eos; under a grammar
  // always: once the output is a complete match they are all it allows.
  bool StopsAtEos() const {
    return !req_.stopping().ignore_eos() || req_.has_structured_output();
  }
  // A stop after the deadline is DEADLINE_EXCEEDED however it was noticed
  // first (the client's side giving up, or the worker call's own deadline):
  // both happen at the same instant.
  absl::Status StoppedByClient() {
    if (absl::Now() >= deadline_) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the deadline passed after ", produced_, " generated tokens"));
    }
    finish_ = specserve::v1::CANCELLED;
    return absl::OkStatus();
  }
  absl::Status WaitForSlot(AdmissionTicket* ticket);
  // Returns at once while a worker is available, else waits for one
  // (scheduler/worker_wait.h): CANCELLED if the client cancels meanwhile.
  absl::Status AwaitWorker();
  absl::Status Tokenize();
  absl::Status OpenSession();
  // Makes the session resident on an available worker (rebuilding it by
  // prefill when it is NEW or LOST there).
  absl::Status EnsureResident();
  // Admits the session on `worker` with `history`, its checkpoint at the
  // table's rewind position.
  absl::Status AdmitOn(int worker, const std::vector<uint32_t>& history);
  // The gate's inputs for this session on the worker `info` describes (the
  // cost tables are kept in gate_*_costs_, which the inputs point into).
  SpecGateInputs GateInputs(const specserve::worker::v1::WorkerInfo& info,
                            const SessionSnapshot& snap);
  // A session admitted without draft state (BATCHED, never demoted) whose
  // turn asks for speculation, where the gate would let it speculate: its
  // copy is released so that EnsureResident rebuilds it with draft state.
  void PromoteIfAsked();
  // The spec gate for the next burst: returns the draft depth (0 = plain).
  uint32_t Gate();
  absl::Status RunBursts();
  // Records this turn (the rewind, the suffix, its checkpoint) in the
  // history once the worker has appended the suffix; once per turn.
  void RecordTurn();
  // Worker-side copy no longer trusted: release it, mark the session LOST.
  void DropWorkerCopy(const std::string& why);
  void Park();
  // Automatic prefix reuse (scheduler/prefix_reuse.h): a session with
  // nothing resident yet starts as a copy of a cached checkpoint of its
  // prompt's longest known prefix; base_ then holds that prefix and input_
  // the rest. False: no usable checkpoint (nothing changed).
  bool ForkFromPrefix();
  void SendFinal();
  grpc::Status Fail(const absl::Status& s);

  SchedulerContext* const ctx_;
  const GenerateRequest& req_;
  // The caller's tenant: the session and the request id are looked up in it.
  const std::string tenant_;
  Limits limits_;
  std::vector<uint32_t> eos_;
  // The tokenizer this request started with (Admin.LoadModel may replace
  // the context's); null: ids only.
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer_;
  const absl::Time deadline_;
  GenerateWriter* const out_;
  const uint32_t inject_nan_at_;  // tests only; 0 = off

  std::string request_id_;
  RequestRegistry::CancelFlag cancel_;
  absl::Time start_ = absl::Now();
  std::optional<absl::Time> first_token_time_;
  std::optional<absl::Time> last_token_time_;

  std::vector<uint32_t> input_;  // this turn's new tokens
  bool input_was_text_ = false;
  bool one_shot_ = false;
  SessionLease lease_;
  std::string session_id_;  // lease_.id(), kept after the lease is released
  // A REWIND turn: the history is cut back to the checkpoint when the turn
  // is recorded.
  bool rewind_ = false;
  // Whether the worker copy must rewind first: false once the copy was
  // rebuilt from the history up to the checkpoint (it already ends there).
  // Kept apart from rewind_, which still applies to the history: mixing the
  // two left the discarded reply in the history of a REWIND turn on a LOST
  // session.
  bool worker_rewind_ = false;
  // History the worker copy must hold before this turn's suffix.
  std::vector<uint32_t> base_;
  int worker_ = -1;
  bool worker_has_base_ = false;  // the worker copy already holds base_
  uint64_t seed_ = 0;
  uint32_t max_tokens_ = 0;

  std::unique_ptr<OutputStream> output_;
  uint32_t produced_ = 0;  // tokens committed by this request's bursts
  uint32_t cached_ = 0;
  // Prompt tokens taken from a cached checkpoint (moved from input_ to
  // base_ by ForkFromPrefix).
  uint32_t prefix_reused_ = 0;
  // The session table tenant of this request's session: a one-shot one is
  // filed under the prefix cache's tenant, which keeps it once parked.
  std::string table_tenant_;
  // This turn's worker copy was rebuilt by a prefill of the history: none
  // of its prompt came from a cache.
  bool rebuilt_ = false;
  // The worker copy was admitted since the last burst that ended well: it
  // holds exactly what it was admitted with, so a burst it refuses is not
  // refused for a stale copy.
  bool fresh_copy_ = false;
  // What the copy the last Admit made can run (SPECULATIVE: it holds draft
  // state).
  specserve::v1::DecodeMode admitted_mode_ = specserve::v1::SPECULATIVE;
  bool suffix_recorded_ = false;
  FinishReason finish_ = specserve::v1::FINISH_REASON_UNSPECIFIED;
  bool demoted_ = false;  // this request demoted the session
  std::vector<double> gate_decode_costs_;
  std::vector<double> gate_verify_costs_;
  telemetry::SpecTelemetry spec_totals_;
  // This turn's prompt logprobs (from the burst that appended the suffix),
  // when the request asked for them.
  google::protobuf::RepeatedPtrField<specserve::v1::TokenLogprobs>
      prompt_logprobs_;
};

grpc::Status Call::Run(AdmissionTicket ticket) {
  request_id_ = req_.request_id().empty() ? NewRequestId() : req_.request_id();
  cancel_ = ctx_->requests->Register(tenant_, request_id_);
  if (cancel_ == nullptr) {
    // Like a second turn on a busy session: the id is free again once that
    // request ends.
    return Fail(absl::AbortedError(absl::StrCat(
        "request_id ", request_id_,
        " is already running; retry once it has ended, or use another id")));
  }
  // Admin.Abort by session id reaches a turn on a named session while it is
  // still queued, too (an opened session's id is known from the start).
  if (req_.has_session() && !req_.session().session_id().empty()) {
    ctx_->requests->SetSession(tenant_, request_id_,
                               req_.session().session_id());
  }
  absl::Status s = WaitForSlot(&ticket);
  // The workers may all have gone while the request was queued.
  if (s.ok()) s = AwaitWorker();
  if (s.ok() && !ctx_->CurrentLimits(&limits_)) {
    s = NoWorkerError(*ctx_->workers, absl::ZeroDuration());
  }
  eos_ = ctx_->EosIds();
  tokenizer_ = ctx_->Tokenizer();
  if (s.ok()) s = Tokenize();
  if (s.ok()) s = OpenSession();
  if (s.ok()) s = RunBursts();
  // The session is parked and idle again BEFORE the client hears the end of
  // the request (final event or error): a client that sends its next turn as
  // soon as this one ends must not get ABORTED "already has a request in
  // flight".
  if (lease_.valid()) {
    session_id_ = lease_.id();
    // Parks a kept session (or frees a one-shot one); failed paths already
    // dropped the worker copy (worker_ < 0).
    Park();
    if (one_shot_ && lease_.valid()) {
      const std::string id = lease_.id();
      lease_.Release();
      ctx_->sessions->Close(id, table_tenant_).IgnoreError();
    }
    if (lease_.valid()) {
      // Closed while Park ran: the close left the copy to this request.
      const std::string id = lease_.id();
      const int worker = worker_;
      if (lease_.ReleaseSeeingClose() && worker >= 0) {
        ctx_->workers->ReleaseNowOrLater(worker, id);
      }
    }
  }
  // The id is reusable at once too.
  ctx_->requests->Unregister(tenant_, request_id_);
  grpc::Status status = grpc::Status::OK;
  if (!s.ok()) {
    status = Fail(s);
  } else {
    SendFinal();
  }
  ctx_->metrics->num_requests_running()->Add(-1);
  ctx_->metrics->e2e_request_latency()->Observe(
      absl::ToDoubleSeconds(absl::Now() - start_));
  return status;
}

grpc::Status Call::Fail(const absl::Status& s) {
  ctx_->metrics->requests_rejected(s.code())->Increment();
  return telemetry::ToGrpc(s);
}

absl::Status Call::WaitForSlot(AdmissionTicket* ticket) {
  ctx_->metrics->num_requests_waiting()->Add(1);
  // Cancelled() also sees Admin.Abort: an aborted request leaves the queue
  // at once instead of running (and prefilling) once promoted.
  absl::Status s = ticket->Wait(deadline_, [this] { return Cancelled(); });
  if (s.code() == absl::StatusCode::kCancelled && !out_->cancelled() &&
      telemetry::DrainRequested()) {
    // Aborted, not cancelled by its client, most likely by the drain's
    // cut-off: it never ran, so it can be sent elsewhere.
    s = absl::UnavailableError(
        "server is draining: the request was cancelled while queued for "
        "admission");
  }
  ctx_->metrics->num_requests_waiting()->Add(-1);
  ctx_->metrics->num_requests_running()->Add(1);
  ctx_->metrics->request_queue_time()->Observe(
      absl::ToDoubleSeconds(absl::Now() - start_));
  return s;
}

absl::Status Call::AwaitWorker() {
  return scheduler::AwaitWorker(*ctx_, deadline_, [this] {
    return Cancelled()
               ? absl::CancelledError("cancelled while waiting for a worker")
               : absl::OkStatus();
  });
}

absl::Status Call::Tokenize() {
  if (req_.has_token_ids()) {
    input_.assign(req_.token_ids().ids().begin(), req_.token_ids().ids().end());
  } else {
    if (tokenizer_ == nullptr) {
      return absl::FailedPreconditionError(
          "this model directory has no tokenizer.json: send token_ids "
          "instead of text");
    }
    input_ = tokenizer_->Encode(req_.text(), /*parse_special=*/true);
    input_was_text_ = true;
  }
  return absl::OkStatus();
}

absl::Status Call::OpenSession() {
  one_shot_ = !req_.has_session();
  max_tokens_ = req_.stopping().max_tokens();
  const uint32_t k_room = kMaxDraftDepth + 2;
  if (one_shot_ || req_.session().session_id().empty()) {
    uint32_t capacity = one_shot_ ? 0 : req_.session().capacity();
    if (one_shot_) {
      SS_RETURN_IF_ERROR(
          ValidatePromptLength(input_.size(), max_tokens_, limits_));
      // Room for the prompt, max_tokens and a round at the deepest k past
      // them, so the capacity never shrinks one.
      capacity = max_tokens_ == 0
                     ? limits_.max_context
                     : std::min<uint64_t>(limits_.max_context,
                                          input_.size() + max_tokens_ + k_room);
    }
    table_tenant_ =
        one_shot_ && ctx_->prefix != nullptr ? OwnedTenant(tenant_) : tenant_;
    SS_ASSIGN_OR_RETURN(
        lease_, ctx_->sessions->OpenAndAcquire(capacity, table_tenant_));
  } else {
    SS_ASSIGN_OR_RETURN(
        lease_, ctx_->sessions->Acquire(req_.session().session_id(), tenant_));
  }
  ctx_->requests->SetSession(tenant_, request_id_, lease_.id());
  const SessionSnapshot snap = lease_.Snapshot();
  std::vector<uint32_t> history = lease_.History();
  rewind_ =
      !one_shot_ && req_.session().mode() == specserve::v1::SessionTurn::REWIND;
  worker_rewind_ = rewind_;
  if (rewind_) {
    if (!snap.rewind_pos) {
      return absl::FailedPreconditionError(absl::StrCat(
          "session ", lease_.id(), " has no prompt checkpoint to rewind to"));
    }
    history.resize(*snap.rewind_pos);
  }
  base_ = std::move(history);
  if (base_.empty() && input_.empty()) {
    return absl::InvalidArgumentError(
        "empty input on a session with no history: nothing to continue from");
  }
  SS_RETURN_IF_ERROR(ValidateSessionTurn(base_.size(), input_.size(),
                                         max_tokens_, snap.capacity));
  seed_ = req_.sampling().seed() != 0 ? req_.sampling().seed() : RandomU64();

  OutputOptions output;
  output.stop_ids.insert(req_.stopping().stop_token_ids().begin(),
                         req_.stopping().stop_token_ids().end());
  if (StopsAtEos()) output.stop_ids.insert(eos_.begin(), eos_.end());
  // Explicit choices win; unset ones follow the input's form.
  const specserve::v1::ResponseOptions& r = req_.response();
  output.want_text = r.has_text() ? r.text() : input_was_text_;
  output.want_ids = r.has_ids() ? r.ids() : !input_was_text_;
  output.stop_strings.assign(req_.stopping().stop().begin(),
                             req_.stopping().stop().end());
  output.min_tokens = req_.stopping().min_tokens();
  output.show_stop_token = r.include_stop_token();
  output_ = std::make_unique<OutputStream>(tokenizer_.get(), std::move(output));
  // Counted once the turn is admitted (it fits the context and the session):
  // a refused prompt is never prefilled.
  ctx_->metrics->prompt_tokens()->Increment(input_.size());
  ctx_->metrics->request_prompt_tokens()->Observe(input_.size());
  return absl::OkStatus();
}

absl::Status Call::AdmitOn(int worker, const std::vector<uint32_t>& history) {
  specserve::worker::v1::AdmitRequest admit;
  admit.set_session_id(lease_.id());
  admit.set_owner(ctx_->workers->owner());
  admit.set_capacity(lease_.Snapshot().capacity);
  admit.mutable_history()->Add(history.begin(), history.end());
  // The turn's prompt follows in the first burst unless it is recorded.
  admit.set_prompt_rows(static_cast<uint32_t>(
      history.size() + (suffix_recorded_ ? 0 : input_.size())));
  // The copy's REWIND target is the table's: a rebuilt session rewinds to the
  // same prompt end as the one it replaces.
  const std::optional<uint32_t> rewind_pos = lease_.Snapshot().rewind_pos;
  if (rewind_pos && *rewind_pos <= history.size()) {
    admit.set_checkpoint_pos(*rewind_pos);
  }
  // Draft state only where a round may run: a turn that asks for no
  // speculation runs batched decode with a fraction of the memory (no MTP
  // KV, no verify captures); a later turn that asks for it promotes the
  // session (PromoteIfAsked); a demoted one stays demoted (one-way) when
  // rebuilt.
  admit.set_speculative(req_.speculation().enable() &&
                        lease_.Snapshot().mode != specserve::v1::BATCHED);
  // A one-shot request's verify captures are sized for its own depth (its
  // only turn; the gate never picks deeper); a session's for the deepest,
  // since a later turn may ask for any k.
  if (one_shot_) {
    admit.set_draft_depth(req_.speculation().k() > 0 ? req_.speculation().k()
                                                     : ctx_->options.default_k);
  }
  // Watched (WorkerPool::Admit): on a worker that stops answering it fails
  // UNAVAILABLE as soon as the monitor notices, and EnsureResident places
  // the session on another worker.
  const absl::Time until =
      std::min(deadline_, absl::Now() + ctx_->options.worker_call_timeout);
  specserve::worker::v1::SessionState state;
  grpc::Status s = ctx_->workers->Admit(worker, admit, until, &state);
  if (s.error_code() == grpc::StatusCode::ALREADY_EXISTS) {
    // A stale copy from before a lost burst: replace it.
    ctx_->workers->Release(worker, lease_.id(), absl::Seconds(5));
    s = ctx_->workers->Admit(worker, admit, until, &state);
  }
  if (s.ok()) admitted_mode_ = state.mode();
  if (!s.ok()) {
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      ctx_->workers->MarkUnavailable(worker, s.error_message());
    }
    return absl::Status(
        static_cast<absl::StatusCode>(s.error_code()),
        absl::StrCat("admitting session on worker ",
                     ctx_->workers->address(worker), ": ", s.error_message()));
  }
  return absl::OkStatus();
}

bool Call::ForkFromPrefix() {
  // Prompt logprobs need every prompt row's logits: prefilled, not reused.
  if (ctx_->prefix == nullptr || !base_.empty() || suffix_recorded_ ||
      input_.empty() || req_.response().has_prompt_logprobs() ||
      lease_.Snapshot().residency != specserve::v1::NEW) {
    return false;
  }
  const absl::Time until =
      std::min(deadline_, absl::Now() + ctx_->options.worker_call_timeout);
  // Draft state where Admit would give it (AdmitOn).
  const std::optional<PrefixFork> fork = ctx_->prefix->TryFork(
      ctx_, tenant_, &lease_, input_, req_.speculation().enable(), until);
  if (!fork) return false;
  worker_ = fork->worker;
  base_.assign(input_.begin(), input_.begin() + fork->pos);
  input_.erase(input_.begin(), input_.begin() + fork->pos);
  prefix_reused_ = fork->pos;
  lease_.AppendCommitted(base_).IgnoreError();
  // The fork's prompt checkpoint: a turn that prefills nothing more ends
  // its prompt there.
  lease_.SetRewindPos(fork->pos).IgnoreError();
  worker_has_base_ = true;
  fresh_copy_ = true;
  admitted_mode_ = fork->mode;
  lease_.SetResidency(specserve::v1::ACTIVE, admitted_mode_, worker_);
  return true;
}

void Call::PromoteIfAsked() {
  const SessionSnapshot snap = lease_.Snapshot();
  if (!req_.speculation().enable() || snap.demoted ||
      snap.mode != specserve::v1::BATCHED || snap.worker < 0 ||
      suffix_recorded_) {
    return;
  }
  const specserve::worker::v1::WorkerInfo info =
      ctx_->workers->Info(snap.worker);
  if (!info.model().has_mtp()) return;
  // Only where the gate would let it speculate now (a first decision):
  // under load it stays plain and keeps its copy.
  SpecGateInputs in = GateInputs(info, snap);
  in.current_mode = specserve::v1::DECODE_MODE_UNSPECIFIED;
  if (DecideSpec(in, ctx_->options.gate).mode != specserve::v1::SPECULATIVE) {
    return;
  }
  // The draft state needs every row's MTP entry, which needs every row's
  // hidden state: the copy is rebuilt from the history, with draft state
  // (AdmitOn), as a lost one would be.
  LOG(INFO) << "session " << lease_.id()
            << ": promoted to speculative decoding; rebuilding it with draft "
               "state from its history";
  ctx_->workers->ReleaseNowOrLater(snap.worker, lease_.id());
  lease_.SetResidency(specserve::v1::LOST,
                      specserve::v1::DECODE_MODE_UNSPECIFIED, -1);
}

absl::Status Call::EnsureResident() {
  if (ForkFromPrefix()) return absl::OkStatus();
  PromoteIfAsked();
  const SessionSnapshot snap = lease_.Snapshot();
  const bool has_copy =
      snap.worker >= 0 && (snap.residency == specserve::v1::PARKED ||
                           snap.residency == specserve::v1::ACTIVE ||
                           snap.residency == specserve::v1::OFFLOADED);
  if (has_copy && ctx_->workers->Available(snap.worker)) {
    worker_ = snap.worker;
    worker_has_base_ = true;
    fresh_copy_ = false;
    // Running now: counted by the gate's batch size and the sessions gauge
    // until Park (or a failure) sets it again.
    lease_.SetResidency(specserve::v1::ACTIVE, snap.mode, worker_);
    return absl::OkStatus();
  }
  // A new or lost session gets exactly the history it must continue from:
  // before this turn's input is recorded, base_ (for a rewind, the history
  // up to the checkpoint); once it is (a rebuild in the middle of the turn),
  // everything recorded so far, which the next burst continues.
  const std::vector<uint32_t> history =
      suffix_recorded_ ? lease_.History() : base_;
  specserve::v1::Residency residency =
      has_copy ? specserve::v1::LOST : snap.residency;
  absl::Status admitted;
  // A worker that died since the last health poll fails the Admit with
  // UNAVAILABLE (AdmitOn marks it unavailable), and so does one that stopped
  // answering during the Admit: place again, at most once per worker and
  // once more, waiting for a worker whenever none is available (the only
  // worker may be back within no_worker_wait).
  for (int attempt = 0; attempt <= ctx_->workers->size(); ++attempt) {
    admitted = AwaitWorker();
    if (!admitted.ok()) break;
    {
      // Placed before the Admit returns, so that sessions placed meanwhile
      // count it (PlaceSession's live session counts).
      absl::MutexLock placing(&ctx_->placement_mu);
      std::vector<WorkerLoad> loads;
      for (int i = 0; i < ctx_->workers->size(); ++i) {
        loads.push_back(WorkerLoad::FromInfo(ctx_->workers->Available(i),
                                             ctx_->workers->Info(i)));
        loads.back().placed_sessions = ctx_->sessions->CountPlacedOn(i);
      }
      absl::StatusOr<Placement> p = PlaceSession(residency, snap.worker, loads);
      if (!p.ok() && p.status().code() != absl::StatusCode::kUnavailable) {
        return p.status();
      }
      if (p.ok()) {
        worker_ = p->worker;
        lease_.SetResidency(specserve::v1::ACTIVE, snap.mode, worker_);
      } else {
        // The last worker went away since AwaitWorker saw it: wait again.
        admitted = NoWorkerError(*ctx_->workers, absl::ZeroDuration());
        continue;
      }
    }
    admitted = AdmitOn(worker_, history);
    if (admitted.code() != absl::StatusCode::kUnavailable) break;
    residency = specserve::v1::LOST;
  }
  if (!admitted.ok()) {
    worker_ = -1;
    lease_.SetResidency(snap.residency == specserve::v1::NEW
                            ? specserve::v1::NEW
                            : specserve::v1::LOST,
                        snap.mode, -1);
    return admitted;
  }
  if (has_copy && snap.worker != worker_) {
    // The copy on the worker that stopped answering is abandoned: freed
    // before that worker is used again, or it would stay there for good.
    ctx_->workers->ReleaseNowOrLater(snap.worker, lease_.id());
  }
  worker_has_base_ = true;
  rebuilt_ = rebuilt_ || !history.empty();
  fresh_copy_ = true;
  worker_rewind_ = false;  // the rebuilt copy already ends at the checkpoint
  if (snap.residency == specserve::v1::LOST || has_copy) {
    LOG(INFO) << "session " << lease_.id() << " rebuilt on worker "
              << ctx_->workers->address(worker_) << " from " << history.size()
              << " tokens of history";
  }
  lease_.SetResidency(specserve::v1::ACTIVE, admitted_mode_, worker_);
  return absl::OkStatus();
}

SpecGateInputs Call::GateInputs(const specserve::worker::v1::WorkerInfo& info,
                                const SessionSnapshot& snap) {
  SpecGateInputs in;
  in.speculation_requested = req_.speculation().enable();
  in.draft_available = info.model().has_mtp();
  in.drafted = snap.telemetry.drafted;
  in.accepted = snap.telemetry.accepted;
  in.k = req_.speculation().k() > 0 ? req_.speculation().k()
                                    : ctx_->options.default_k;
  gate_decode_costs_.assign(info.costs().decode_seconds_by_batch().begin(),
                            info.costs().decode_seconds_by_batch().end());
  gate_verify_costs_.assign(info.costs().verify_seconds_by_columns().begin(),
                            info.costs().verify_seconds_by_columns().end());
  in.decode_seconds_by_batch = gate_decode_costs_;
  in.verify_seconds_by_columns = gate_verify_costs_;
  in.batch_size = std::max(
      1, ctx_->sessions->CountOnWorker(snap.worker, specserve::v1::ACTIVE));
  in.current_mode = snap.mode;
  in.state = snap.gate_state;
  return in;
}

uint32_t Call::Gate() {
  const SessionSnapshot snap = lease_.Snapshot();
  const specserve::worker::v1::WorkerInfo info = ctx_->workers->Info(worker_);
  SpecGateInputs in = GateInputs(info, snap);
  const SpecGateDecision d = DecideSpec(in, ctx_->options.gate);
  lease_.SetGateDecision(d);
  ctx_->metrics->gate_decisions(d.mode)->Increment();
  if (d.mode == specserve::v1::SPECULATIVE) {
    // The depth that pays best at this batch, from the session's measured
    // per-position acceptance (its tokens do not depend on k, §3).
    return ChooseKByPosition(snap.telemetry.drafted_per_position,
                             snap.telemetry.accepted_per_position, in.k,
                             in.batch_size, gate_decode_costs_,
                             gate_verify_costs_);
  }
  if (snap.mode == specserve::v1::SPECULATIVE && !lease_.History().empty() &&
      in.speculation_requested) {
    // One-way demotion: the worker flushes and drops the draft state.
    specserve::worker::v1::SessionState state;
    if (ctx_->workers
            ->Demote(worker_, lease_.id(), ctx_->options.worker_call_timeout,
                     &state)
            .ok()) {
      lease_.SetResidency(specserve::v1::ACTIVE, specserve::v1::BATCHED,
                          worker_);
      lease_.MarkDemoted();
      demoted_ = true;
    }
  }
  return 0;
}

void Call::DropWorkerCopy(const std::string& why) {
  LOG(INFO) << "session " << lease_.id() << ": " << why
            << "; marked LOST (rebuilt from history on its next turn)";
  // A hung worker keeps its copy until it answers again: it is freed then,
  // or it would stay in that worker's pool for good.
  if (worker_ >= 0) ctx_->workers->ReleaseNowOrLater(worker_, lease_.id());
  lease_.SetResidency(specserve::v1::LOST, lease_.Snapshot().mode, -1);
  worker_ = -1;
}

void Call::RecordTurn() {
  if (suffix_recorded_) return;
  if (rewind_) lease_.TruncateTo(base_.size()).IgnoreError();
  lease_.AppendCommitted(input_).IgnoreError();
  // The worker saves a checkpoint only where a prompt ends: an empty
  // continuation leaves it (and so the rewind point) where the last prompt
  // ended.
  if (!input_.empty()) {
    lease_.SetRewindPos(base_.size() + input_.size()).IgnoreError();
  }
  suffix_recorded_ = true;
}

absl::Status Call::RunBursts() {
  SS_RETURN_IF_ERROR(EnsureResident());
  uint32_t k = Gate();
  bool first = true;
  int rebuilds = 0;  // consecutive failed attempts at the current burst
  while (true) {
    if (Cancelled()) return StoppedByClient();
    specserve::worker::v1::BurstRequest b;
    b.set_session_id(lease_.id());
    b.set_owner(ctx_->workers->owner());
    // What the copy must hold (proto/worker.proto's integrity check): the
    // history before this turn (the copy rewinds itself), or up to the
    // checkpoint when it was rebuilt there, until the suffix is recorded;
    // then the whole history, which records every token it committed.
    b.set_expect_history_len(suffix_recorded_ || worker_rewind_
                                 ? lease_.Snapshot().committed_len
                                 : static_cast<uint32_t>(base_.size()));
    if (first) {
      b.mutable_suffix()->Add(input_.begin(), input_.end());
      b.set_rewind(worker_rewind_);
    }
    uint32_t want = ctx_->options.burst_tokens;
    if (max_tokens_ > 0) want = std::min(want, max_tokens_ - produced_);
    b.set_max_new(want);
    // A one-shot request's output ends at max_tokens: it keeps no history
    // the client must stay in step with, so its rounds draft no deeper than
    // keeps them within it (no overshoot), and its kept session (prefix
    // reuse) ends where the output does. A session turn may overshoot: its
    // history holds every row, and the client sees them.
    if (one_shot_ && max_tokens_ > 0) b.set_max_emit(max_tokens_ - produced_);
    *b.mutable_sampling() = req_.sampling();
    b.mutable_sampling()->set_seed(seed_);
    b.set_k(k);
    const specserve::v1::ResponseOptions& response = req_.response();
    if (response.has_logprobs()) b.set_logprobs(response.logprobs());
    // Only the burst that appends the suffix scores the prompt.
    if (first && response.has_prompt_logprobs()) {
      b.set_prompt_logprobs(response.prompt_logprobs());
    }
    // Fault injection counts tokens per burst on the worker: aim at the
    // request's n-th token within the burst that will produce it.
    if (inject_nan_at_ > produced_) {
      b.set_inject_nan_at(inject_nan_at_ - produced_);
    }
    for (uint32_t id : req_.stopping().stop_token_ids())
      b.add_stop_token_ids(id);
    if (StopsAtEos()) {
      for (uint32_t id : eos_) b.add_stop_token_ids(id);
    }
    if (req_.has_structured_output()) {
      *b.mutable_structured_output() = req_.structured_output();
    }
    // The logit controls count this request's output: the history ends
    // with the produced_ tokens of its earlier bursts.
    b.set_min_tokens(req_.stopping().min_tokens());
    b.set_prior_output_tokens(produced_);
    absl::Status feed_status;
    uint32_t tokens_this_burst = 0;
    BurstWatch watch;
    watch.client_cancelled = [this] { return Cancelled(); };
    const int w = worker_;
    watch.worker_available = [this, w] { return ctx_->workers->Available(w); };
    watch.deadline = deadline_;
    IdlePoller::StreamingScope streaming(ctx_->idle_poller);
    BurstOutcome o = RunBurstOnWorker(
        ctx_->workers->stub(worker_), b, watch,
        [&](absl::Span<const uint32_t> tokens,
            const google::protobuf::RepeatedPtrField<
                specserve::v1::TokenLogprobs>& logprobs) {
          // The copy is dropped below: nothing after the failure is kept.
          if (!feed_status.ok()) return false;
          if (first) RecordTurn();
          lease_.AppendCommitted(tokens).IgnoreError();
          tokens_this_burst += tokens.size();
          produced_ += tokens.size();
          ctx_->metrics->generation_tokens()->Increment(tokens.size());
          const absl::Time now = absl::Now();
          if (!last_token_time_) {
            first_token_time_ = now;
            ctx_->metrics->time_to_first_token()->Observe(
                absl::ToDoubleSeconds(now - start_));
          } else {
            ctx_->metrics->ObserveInterTokenLatency(
                absl::ToDoubleSeconds(now - *last_token_time_) / tokens.size());
          }
          last_token_time_ = now;
          auto delta =
              output_->Feed(std::vector<uint32_t>(tokens.begin(), tokens.end()),
                            response.has_logprobs() ? &logprobs : nullptr);
          if (!delta.ok()) {
            feed_status = delta.status();
            return false;
          }
          if (delta->ids_size() > 0 || !delta->text().empty() ||
              delta->logprobs_size() > 0) {
            GenerateEvent e;
            *e.mutable_delta() = std::move(*delta);
            if (!out_->Write(std::move(e))) return false;  // the client is gone
          }
          return true;
        });
    if (!feed_status.ok()) {
      DropWorkerCopy("output could not be decoded");
      return feed_status;
    }
    if (!o.status.ok() || !o.summary) {
      if (o.stop_requested) {
        // The burst did not end with its summary (the worker took longer
        // than the stop grace, failed, or the deadline passed): what it
        // committed past the tokens received is unknown.
        DropWorkerCopy(
            absl::StrCat("burst stopped for a cancel but not "
                         "ended by the worker (",
                         o.status.error_message(), ")"));
        return StoppedByClient();
      }
      const grpc::StatusCode code =
          o.cancelled_by == BurstOutcome::CancelledBy::kWorkerDown
              ? grpc::StatusCode::UNAVAILABLE
              : o.status.error_code();
      const std::string address = ctx_->workers->address(w);
      // Only a failed connection says the worker is gone. A burst we
      // cancelled (its client, its deadline, or the watch once the health
      // polls marked the worker down) or that ran slow says nothing about
      // the worker: the health polls decide (scheduler/worker_pool.h).
      if (o.status.error_code() == grpc::StatusCode::UNAVAILABLE &&
          o.cancelled_by == BurstOutcome::CancelledBy::kNone) {
        ctx_->workers->MarkUnavailable(
            w, "burst could not reach it: " + o.status.error_message());
      }
      // Retry on a rebuilt copy when nothing of this burst reached the
      // client: the worker restarted or evicted the session (NOT_FOUND); it
      // died since the last health poll before this request streamed
      // anything (UNAVAILABLE: the client sees no failure at all); or its
      // copy cannot serve the burst as it stands (FAILED_PRECONDITION: it
      // cannot rewind — a demoted session has no checkpoint, or its rows
      // left residency — or it does not hold the history length this
      // scheduler expects, so something else changed it) — the history
      // rebuilds it. A fresh copy's refusal is the request's own.
      const bool stale_copy =
          code == grpc::StatusCode::FAILED_PRECONDITION && !fresh_copy_;
      // The worker refuses a burst's parameters (a grammar that does not
      // compile) before it touches the session: the copy stays as it was,
      // and so does the history (no token came).
      if (tokens_this_burst == 0 && produced_ == 0 &&
          (code == grpc::StatusCode::INVALID_ARGUMENT ||
           code == grpc::StatusCode::UNIMPLEMENTED)) {
        return absl::Status(static_cast<absl::StatusCode>(code),
                            o.status.error_message());
      }
      // Bounded: a copy can be evicted again before its retry runs (the
      // pool drops idle sessions under host-memory pressure), and each
      // worker can fail once.
      if (tokens_this_burst == 0 && rebuilds++ < ctx_->workers->size() + 2 &&
          (code == grpc::StatusCode::NOT_FOUND || stale_copy ||
           (code == grpc::StatusCode::UNAVAILABLE && produced_ == 0))) {
        DropWorkerCopy(absl::StrCat(
            "burst on worker ", address, " failed before any token (",
            o.status.error_message(), "); rebuilding it now"));
        SS_RETURN_IF_ERROR(EnsureResident());
        continue;
      }
      DropWorkerCopy(absl::StrCat("burst failed on worker ", address, ": ",
                                  o.status.error_message()));
      // A one-shot request has no next turn: its own session goes with it.
      if (code == grpc::StatusCode::UNAVAILABLE) {
        return absl::UnavailableError(
            one_shot_ ? absl::StrCat("worker ", address,
                                     " failed during the request; retry it")
                      : absl::StrCat("worker ", address,
                                     " failed during the request; the "
                                     "session keeps everything sent so far "
                                     "and is rebuilt on its next turn"));
      }
      if (code == grpc::StatusCode::NOT_FOUND) {
        // The worker kept losing its copy (evictions under memory pressure
        // outran the rebuilds). Public NOT_FOUND means an unknown session,
        // which this is not: say the server is out of memory.
        return absl::ResourceExhaustedError(
            one_shot_ ? absl::StrCat("worker ", address,
                                     " keeps evicting this request's caches "
                                     "under memory pressure: retry later")
                      : absl::StrCat("worker ", address,
                                     " keeps evicting session ", lease_.id(),
                                     " under memory pressure; it keeps "
                                     "everything sent so far: retry later"));
      }
      return absl::Status(static_cast<absl::StatusCode>(code),
                          o.status.error_message());
    }
    rebuilds = 0;  // a session evicted between bursts may be rebuilt again
    fresh_copy_ = false;
    const BurstSummary& sum = *o.summary;
    // A rebuilt copy reports the history it was admitted with as cached;
    // that history was prefilled for this turn.
    if (first) cached_ = rebuilt_ ? 0 : sum.cached_tokens();
    if (first) prompt_logprobs_ = sum.prompt_logprobs();
    // A burst can end well with no token (no round fits the capacity): its
    // suffix is in the copy all the same.
    if (first) RecordTurn();
    first = false;
    lease_.AddTelemetry(sum.telemetry_delta());
    spec_totals_.Add(sum.telemetry_delta());
    ctx_->metrics->RecordSpecTelemetry(sum.telemetry_delta());
    if (output_->stopped() || sum.end() == specserve::worker::v1::STOP_TOKEN) {
      finish_ = specserve::v1::STOP;
      return absl::OkStatus();
    }
    if (sum.end() == specserve::worker::v1::CAPACITY) {
      finish_ = specserve::v1::CONTEXT_FULL;
      return absl::OkStatus();
    }
    if (max_tokens_ > 0 && produced_ >= max_tokens_) {
      finish_ = specserve::v1::LENGTH;
      return absl::OkStatus();
    }
    // Stopped at a round boundary: the history holds every token the worker
    // committed (after a client cancel, possibly some the client never got)
    // and the copy is parked as it stands.
    if (o.stop_requested) return StoppedByClient();
    if (k > 0) k = Gate();  // concurrency may have changed
  }
}

void Call::Park() {
  if (worker_ < 0) return;
  // A session closed while this request ran (CloseSession leaves a busy
  // session's caches to its request) is freed like a one-shot one, not
  // parked where nothing would ever release it.
  // A one-shot request's session is kept parked for prefix reuse when the
  // cache is on (scheduler/prefix_reuse.h); otherwise freed.
  const bool keep = one_shot_ && ctx_->prefix != nullptr;
  if ((one_shot_ && !keep) || lease_.closed()) {
    ctx_->workers->ReleaseNowOrLater(worker_, lease_.id());
    const std::string id = lease_.id();
    lease_.Release();
    if (one_shot_) ctx_->sessions->Close(id, table_tenant_).IgnoreError();
    return;
  }
  specserve::worker::v1::SessionState state;
  grpc::Status s = ctx_->workers->Park(
      worker_, lease_.id(), ctx_->options.worker_call_timeout, &state);
  if (!s.ok()) {
    DropWorkerCopy("park failed: " + s.error_message());
    return;
  }
  lease_.SetResidency(state.residency() == specserve::worker::v1::OFFLOADED
                          ? specserve::v1::OFFLOADED
                          : specserve::v1::PARKED,
                      state.mode(), worker_);
  lease_.SetPrefixCheckpoints(std::vector<uint32_t>(
      state.prefix_checkpoints().begin(), state.prefix_checkpoints().end()));
  if (ctx_->prefix != nullptr) {
    ctx_->prefix->RecordParked(ctx_, tenant_, lease_, /*owned=*/keep);
    // The cache owns a kept one-shot session now: Run must not close it.
    if (keep) lease_.Release();
  }
}

void Call::SendFinal() {
  GenerateEvent tail;
  *tail.mutable_delta() = output_->Finish();
  if (tail.delta().ids_size() > 0 || !tail.delta().text().empty()) {
    out_->Write(std::move(tail));
  }
  GenerateEvent e;
  auto* f = e.mutable_final();
  f->set_finish_reason(finish_);
  auto* u = f->mutable_usage();
  u->set_prompt_tokens(prefix_reused_ + input_.size());
  u->set_completion_tokens(output_->shown_tokens());
  u->set_cached_prompt_tokens(cached_);
  u->set_overshoot_tokens(
      max_tokens_ > 0 && produced_ > max_tokens_ ? produced_ - max_tokens_ : 0);
  if (req_.response().spec_stats()) {
    const specserve::v1::SessionTelemetry t = spec_totals_.ToProto();
    auto* st = f->mutable_spec_stats();
    st->set_rounds(t.rounds());
    st->set_drafted(t.drafted());
    st->set_accepted(t.accepted());
    *st->mutable_drafted_per_position() = t.drafted_per_position();
    *st->mutable_accepted_per_position() = t.accepted_per_position();
    st->set_demoted(demoted_);
  }
  if (!one_shot_) f->set_session_id(session_id_);
  f->set_request_id(request_id_);
  f->set_seed(seed_);
  if (finish_ == specserve::v1::STOP) {
    if (output_->matched_token()) {
      f->set_matched_token_id(*output_->matched_token());
    } else if (output_->matched_string()) {
      f->set_matched_stop_str(*output_->matched_string());
    }
  }
  *f->mutable_prompt_logprobs() = std::move(prompt_logprobs_);
  out_->Write(std::move(e));
  ctx_->metrics->request_success(finish_)->Increment();
  ctx_->metrics->request_generation_tokens()->Observe(output_->shown_tokens());
  // vLLM's per-request mean: the time from the first token to the last over
  // the tokens after the first (0 with fewer than two).
  ctx_->metrics->request_time_per_output_token()->Observe(
      produced_ > 1
          ? absl::ToDoubleSeconds(*last_token_time_ - *first_token_time_) /
                (produced_ - 1)
          : 0.0);
}

}  // namespace

grpc::Status RunGenerateCall(SchedulerContext* ctx,
                             const GenerateRequest& request,
                             const std::string& tenant, absl::Time deadline,
                             AdmissionTicket ticket, GenerateWriter* out,
                             uint32_t inject_nan_at) {
  Call call(ctx, request, tenant, deadline, out, inject_nan_at);
  return call.Run(std::move(ticket));
}

}  // namespace specserve::scheduler
