// What every public service of the scheduler shares: options, the worker
// pool, the session table, admission, the tokenizer, metrics, the request
// registry and the authenticator. Owned by main(); services hold a pointer.
#ifndef SPECSERVE_SCHEDULER_SCHEDULER_CONTEXT_H_
#define SPECSERVE_SCHEDULER_SCHEDULER_CONTEXT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"
#include "scheduler/admission.h"
#include "scheduler/authenticator.h"
#include "scheduler/request_registry.h"
#include "scheduler/request_validation.h"
#include "scheduler/session_table.h"
#include "scheduler/spec_gate.h"
#include "scheduler/tokenizer/tokenizer.h"
#include "scheduler/worker_pool.h"
#include "telemetry/scheduler_metrics.h"

namespace specserve::scheduler {

struct SchedulerOptions {
  // Tokens per burst (a round may overshoot).
  uint32_t burst_tokens = 32;
  // Draft depth when a request asks for speculation without a k.
  uint32_t default_k = 3;
  SpecGateConfig gate;
  // Seconds a worker call may take beyond the client's deadline: none.
  // Admin calls to workers (admit, park, release) get this timeout.
  absl::Duration worker_call_timeout = absl::Seconds(60);
  // Sessions idle this long are closed.
  absl::Duration session_idle_ttl = absl::Hours(1);
  // How long a request that finds no available worker waits for one (within
  // its deadline) before it fails UNAVAILABLE (scheduler/worker_wait.h).
  absl::Duration no_worker_wait = absl::Seconds(5);
  // Tests only (docs/RELIABILITY.md row 8): forward the request metadata
  // kInjectNanAtMetadata to the workers as BurstRequest.inject_nan_at. Off by
  // default, so clients of a production scheduler cannot inject faults.
  bool enable_fault_injection = false;
};

// Request metadata naming the n-th generated token (from 1) of a Generate
// request whose logits the worker turns NaN; honoured only with
// SchedulerOptions::enable_fault_injection (and the worker's
// --enable_fault_injection).
inline constexpr char kInjectNanAtMetadata[] = "x-specserve-inject-nan-at";

class IdlePoller;   // scheduler/idle_poller.h
class PrefixReuse;  // scheduler/prefix_reuse.h

struct SchedulerContext {
  SchedulerOptions options;
  // Request limits; vocab_size and max_context come from the workers' model
  // (CurrentLimits()).
  Limits limits;
  WorkerPool* workers = nullptr;
  SessionTable* sessions = nullptr;
  AdmissionController* admission = nullptr;
  // Held from reading the live placement counts to recording the choice
  // (Call::EnsureResident), so concurrent new sessions see each other.
  absl::Mutex placement_mu;
  // The current model's tokenizer; null when its directory has no
  // tokenizer.json (ids only). Admin.LoadModel replaces it: a request
  // takes one snapshot and keeps it.
  std::shared_ptr<const tokenizer::Tokenizer> Tokenizer() const {
    absl::MutexLock lock(&tokenizer_mu_);
    return tokenizer_;
  }
  void SetTokenizer(std::shared_ptr<const tokenizer::Tokenizer> t) {
    absl::MutexLock lock(&tokenizer_mu_);
    tokenizer_ = std::move(t);
  }
  telemetry::SchedulerMetrics* metrics = nullptr;
  RequestRegistry* requests = nullptr;
  // Null: no authentication (every call is Caller::Anonymous()).
  const Authenticator* auth = nullptr;
  // The caller of `call`, or UNAUTHENTICATED: the first thing every public
  // handler does (scheduler/authenticator.h).
  absl::StatusOr<Caller> Authenticate(const grpc::ServerContext& call) const {
    if (auth == nullptr) return Caller::Anonymous();
    return auth->Authenticate(call.client_metadata());
  }
  // Steps aside while a burst streams (null: no effect).
  IdlePoller* idle_poller = nullptr;
  // Automatic prefix reuse in Generate; null: off (--prefix_cache_sessions
  // 0).
  PrefixReuse* prefix = nullptr;
  // `limits` with the model's vocabulary and context filled in from the
  // first available worker; false when no worker has reported a model.
  bool CurrentLimits(Limits* out) const {
    *out = limits;
    for (int i = 0; i < workers->size(); ++i) {
      if (!workers->Available(i)) continue;
      const auto info = workers->Info(i);
      if (!info.has_model()) continue;
      out->vocab_size = info.model().vocab_size();
      out->max_context = info.model().max_context();
      return true;
    }
    return false;
  }
  // EOS ids: the tokenizer's, else the model config's.
  std::vector<uint32_t> EosIds() const {
    const std::shared_ptr<const tokenizer::Tokenizer> tokenizer = Tokenizer();
    if (tokenizer != nullptr && !tokenizer->eos_token_ids().empty()) {
      return tokenizer->eos_token_ids();
    }
    for (int i = 0; i < workers->size(); ++i) {
      const auto info = workers->Info(i);
      if (info.has_model()) {
        return {info.model().eos_token_ids().begin(),
                info.model().eos_token_ids().end()};
      }
    }
    return {};
  }

 private:
  mutable absl::Mutex tokenizer_mu_;
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer_
      ABSL_GUARDED_BY(tokenizer_mu_);
};

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_SCHEDULER_CONTEXT_H_
