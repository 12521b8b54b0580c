// libFuzzer target: a worker's handling of a Burst request, on
// tests/models/tiny_a with the CPU backend (one thread), through the real
// SessionPool and SpecEngine. The input is the request's wire bytes
// (specserve.worker.v1.BurstRequest; bytes that do not parse are dropped, as
// gRPC's deserializer refuses them before any handler runs).
//
// Per input: a fresh session "s" of owner "" is admitted (engine Admit of 5
// history tokens into kCapacity rows, then SessionPool::Insert, as
// WorkerService::Admit does) and the request runs three times on it, as
// three consecutive Burst calls: the second is stopped after its first tokens
// (StopBurst). The tiny capacity bounds the work of any input, whatever
// max_new and k say. Two bits of sampling.seed pick the setting: bit 0, a
// device budget of 1 byte (the session is offloaded between bursts and
// restored by the next one); bit 1, a plain session (admitted with
// speculative = false: no draft state).
//
// Burst() below is WorkerService::Burst + RunBurst (worker/worker_service.cc)
// without gRPC: the request checks and parameters are the worker's own
// (worker/burst_request.h); the owner and expect_history_len checks are
// restated here; fault injection is on.
//
// Checked besides "no crash, no sanitizer report, no CHECK failure" (the
// session checks its invariants at every burst boundary):
//  - a refusal is a validation code (INVALID_ARGUMENT, OUT_OF_RANGE,
//    FAILED_PRECONDITION, NOT_FOUND, ABORTED) unless NaN was injected; a
//    session not dropped after an error still satisfies its invariants;
//  - a burst runs only with 1 <= max_new and k <= the largest draft depth
//    (the two request checks);
//  - a burst that ends OK emitted `produced` tokens, all in the vocabulary;
//    overshoot == max(0, produced - max_new) and <= k, produced <= max_emit
//    when set; MAX_NEW means produced >= max_new, STOP_TOKEN that a stop id
//    was emitted, CANCELLED that the burst was asked to stop;
//  - every emitted token is committed or the carried pending token: the
//    session's tokens (committed, then pending) end with the burst's output;
//  - with logprobs asked, every emitted token has its entry (its id, a
//    finite logprob <= 0, min(n, V) alternatives by descending logprob);
//    without, none.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "google/protobuf/stubs/logging.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/sampling/sampling.h"
#include "proto/api_limits.h"
#include "proto/worker.pb.h"
#include "worker/burst_request.h"
#include "worker/model/model.h"
#include "worker/session_pool.h"
#include "worker/spec/model_executor.h"
#include "worker/spec/spec_engine.h"

namespace {

namespace wv1 = specserve::worker::v1;
using specserve::spec::BurstEnd;
using specserve::spec::BurstParams;
using specserve::spec::BurstResult;
using specserve::worker::SessionPool;

#define FUZZ_CHECK(cond, ...)                                 \
  do {                                                        \
    if (!(cond)) {                                            \
      std::fprintf(stderr, "FUZZ_CHECK failed: %s: ", #cond); \
      std::fprintf(stderr, __VA_ARGS__);                      \
      std::fprintf(stderr, "\n");                             \
      std::abort();                                           \
    }                                                         \
  } while (0)

constexpr char kSessionId[] = "s";
constexpr int kCapacity = 32;
const std::vector<int32_t> kHistory = {11, 42, 7, 300, 5};

struct World {
  std::unique_ptr<specserve::kernels::Backend> backend;
  std::unique_ptr<specserve::model::Model> model;
  std::unique_ptr<specserve::spec::ModelExecutor> executor;
  std::unique_ptr<specserve::spec::SpecEngine> engine;
  std::unique_ptr<SessionPool> roomy;  // default budgets
  std::unique_ptr<SessionPool> tight;  // offloads every idle session
};
World* g = nullptr;
bool g_verbose = false;  // SPECSERVE_FUZZ_VERBOSE=1: print each burst

// worker_service.cc
bool LeavesSessionInconsistent(const absl::Status& s) {
  return s.code() == absl::StatusCode::kInternal ||
         s.code() == absl::StatusCode::kUnknown ||
         s.code() == absl::StatusCode::kDataLoss;
}

struct Outcome {
  absl::Status status;
  BurstResult result;
  std::vector<int32_t> emitted;
  std::vector<specserve::spec::TokenLogprobs> logprobs;
  bool stop_requested = false;
  bool discarded = false;
};

// WorkerService::Burst + RunBurst. `stop_after_first`: StopBurst arrives
// while the first tokens are written.
Outcome Burst(SessionPool* pool, const wv1::BurstRequest& request,
              bool stop_after_first) {
  Outcome o;
  o.status = specserve::worker::CheckBurstLimits(request);
  if (!o.status.ok()) return o;
  auto lease = pool->Acquire(request.session_id(), request.owner());
  if (!lease.ok()) {
    o.status = lease.status();
    return o;
  }
  if (request.has_expect_history_len()) {
    const specserve::spec::SpecSession& s = *lease->get();
    const uint32_t holds = s.committed_len() + (s.has_pending() ? 1 : 0);
    if (holds != request.expect_history_len()) {
      o.status = absl::FailedPreconditionError(
          absl::StrCat("session holds ", holds,
                       " tokens of history, the "
                       "caller expects ",
                       request.expect_history_len()));
      return o;
    }
  }
  absl::StatusOr<BurstParams> params =
      specserve::worker::BurstParamsOf(request, /*fault_injection=*/true,
                                       /*grammars=*/nullptr);
  if (!params.ok()) {
    o.status = params.status();
  } else {
    const BurstParams& p = *params;
    auto r = g->engine->RunBurst(
        lease->get(), p,
        [&](absl::Span<const int32_t> t,
            absl::Span<const specserve::spec::TokenLogprobs> lps) {
          o.emitted.insert(o.emitted.end(), t.begin(), t.end());
          o.logprobs.insert(o.logprobs.end(), lps.begin(), lps.end());
          if (stop_after_first) o.stop_requested = true;
          return !o.stop_requested;
        });
    o.status = r.status();
    if (r.ok()) o.result = *r;
  }
  if (!o.status.ok() && LeavesSessionInconsistent(o.status)) {
    lease->Discard();
    o.discarded = true;
  } else {
    // What the next call on the session relies on (RunBurst checks it too).
    (*lease)->CheckInvariants();
  }
  if (o.status.ok()) {
    // Every emitted token is committed or the carried pending token.
    std::vector<int32_t> tokens = (*lease)->committed;
    if ((*lease)->pending_tok) tokens.push_back(*(*lease)->pending_tok);
    FUZZ_CHECK(tokens.size() >= o.emitted.size() &&
                   std::equal(o.emitted.begin(), o.emitted.end(),
                              tokens.end() - o.emitted.size()),
               "the session does not end with the %zu emitted tokens",
               o.emitted.size());
  }
  return o;
}

void CheckOutcome(const wv1::BurstRequest& req, const Outcome& o) {
  if (!o.status.ok()) {
    const absl::StatusCode c = o.status.code();
    const bool validation = c == absl::StatusCode::kInvalidArgument ||
                            c == absl::StatusCode::kOutOfRange ||
                            c == absl::StatusCode::kFailedPrecondition ||
                            c == absl::StatusCode::kNotFound ||
                            c == absl::StatusCode::kAborted;
    FUZZ_CHECK(validation || (c == absl::StatusCode::kInternal &&
                              req.inject_nan_at() > 0),
               "burst failed with %s", o.status.ToString().c_str());
    FUZZ_CHECK(!o.status.message().empty(), "refusal without a message");
    return;
  }
  const BurstResult& r = o.result;
  const int vocab = g->model->config().vocab_size;
  FUZZ_CHECK(r.produced == static_cast<int>(o.emitted.size()),
             "produced %d but %zu tokens emitted", r.produced,
             o.emitted.size());
  for (int32_t t : o.emitted) {
    FUZZ_CHECK(t >= 0 && t < vocab, "emitted token %d outside the vocabulary",
               t);
  }
  if (!req.has_logprobs()) {
    FUZZ_CHECK(o.logprobs.empty(), "%zu logprobs unasked", o.logprobs.size());
  } else {
    FUZZ_CHECK(o.logprobs.size() == o.emitted.size(),
               "%zu logprobs for %zu tokens", o.logprobs.size(),
               o.emitted.size());
    const size_t n = std::min<size_t>(req.logprobs(), vocab);
    for (size_t i = 0; i < o.logprobs.size(); ++i) {
      const specserve::spec::TokenLogprobs& lp = o.logprobs[i];
      FUZZ_CHECK(lp.id == o.emitted[i], "logprobs of %d for token %d", lp.id,
                 o.emitted[i]);
      FUZZ_CHECK(std::isfinite(lp.logprob) && lp.logprob <= 0.0f, "logprob %f",
                 lp.logprob);
      FUZZ_CHECK(lp.top_ids.size() == n && lp.top_logprobs.size() == n,
                 "%zu alternatives, %zu asked", lp.top_ids.size(), n);
      for (size_t j = 1; j < n; ++j) {
        FUZZ_CHECK(lp.top_logprobs[j - 1] >= lp.top_logprobs[j],
                   "alternatives out of order");
      }
    }
  }
  const int64_t max_new = req.max_new();
  const int64_t want_overshoot = std::max<int64_t>(0, r.produced - max_new);
  FUZZ_CHECK(r.overshoot == want_overshoot,
             "overshoot %d, but %d produced for max_new %lld", r.overshoot,
             r.produced, static_cast<long long>(max_new));
  // Accepted, so within the depth the worker's check names.
  FUZZ_CHECK(req.k() <= static_cast<uint32_t>(specserve::kMaxDraftDepth),
             "a burst with k = %u ran (the draft depth limit is %d)", req.k(),
             specserve::kMaxDraftDepth);
  FUZZ_CHECK(r.overshoot <= static_cast<int64_t>(req.k()),
             "overshoot %d past k %u", r.overshoot, req.k());
  FUZZ_CHECK(
      !req.has_max_emit() || r.produced <= static_cast<int64_t>(req.max_emit()),
      "%d produced past max_emit %u", r.produced, req.max_emit());
  switch (r.end) {
    case BurstEnd::kMaxNew:
      FUZZ_CHECK(r.produced >= max_new, "MAX_NEW after %d of %lld tokens",
                 r.produced, static_cast<long long>(max_new));
      break;
    case BurstEnd::kStopToken: {
      bool stopped = false;
      for (int32_t t : o.emitted) {
        for (uint32_t s : req.stop_token_ids()) {
          stopped = stopped || static_cast<int64_t>(s) == t;
        }
      }
      FUZZ_CHECK(stopped, "STOP_TOKEN without a stop id emitted");
      break;
    }
    case BurstEnd::kCancelled:
      FUZZ_CHECK(o.stop_requested, "CANCELLED without a stop");
      break;
    case BurstEnd::kCapacity:
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // protobuf logs every string field that is not UTF-8 (ERROR): quiet.
  google::protobuf::SetLogHandler(nullptr);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 2;  // ERROR and up
  const char* env = std::getenv("SPECSERVE_FUZZ_MODEL");
  const std::string dir = env ? env : "tests/models/tiny_a";
  g_verbose = std::getenv("SPECSERVE_FUZZ_VERBOSE") != nullptr;
  g = new World;
  specserve::kernels::cpu::CpuBackendOptions options;
  options.num_threads = 1;  // deterministic coverage, no pool threads
  g->backend = std::make_unique<specserve::kernels::cpu::CpuBackend>(options);
  auto model = specserve::model::Model::Load(dir, g->backend.get());
  if (!model.ok()) {
    std::fprintf(stderr, "burst_request_fuzzer: cannot load %s: %s\n",
                 dir.c_str(), model.status().ToString().c_str());
    std::exit(1);
  }
  g->model = std::move(*model);
  FUZZ_CHECK(g->model->has_mtp(), "%s has no MTP head", dir.c_str());
  g->executor =
      std::make_unique<specserve::spec::ModelExecutor>(g->model.get());
  g->engine = std::make_unique<specserve::spec::SpecEngine>(g->executor.get());
  g->roomy = std::make_unique<SessionPool>(
      specserve::worker::SessionPoolOptions{}, g->executor.get());
  specserve::worker::SessionPoolOptions tight;
  tight.device_budget_bytes = 1;
  g->tight = std::make_unique<SessionPool>(tight, g->executor.get());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  wv1::BurstRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return -1;
  const uint64_t setting = req.sampling().seed();
  SessionPool* pool = setting & 1 ? g->tight.get() : g->roomy.get();
  const bool speculative = (setting & 2) == 0;

  // WorkerService::Admit.
  auto session = g->engine->Admit(kSessionId, kCapacity, kHistory, std::nullopt,
                                  speculative);
  FUZZ_CHECK(session.ok(), "admit: %s", session.status().ToString().c_str());
  {
    auto lease = pool->Insert(std::move(*session), /*owner=*/"");
    FUZZ_CHECK(lease.ok(), "insert: %s", lease.status().ToString().c_str());
  }  // back to the pool (offloaded by the tight one)

  for (int turn = 0; turn < 3; ++turn) {
    const Outcome o = Burst(pool, req, /*stop_after_first=*/turn == 1);
    if (g_verbose) {
      std::fprintf(stderr, "turn %d: %s, %zu tokens, end %d, overshoot %d\n",
                   turn, o.status.ToString().c_str(), o.emitted.size(),
                   static_cast<int>(o.result.end), o.result.overshoot);
    }
    CheckOutcome(req, o);
    if (o.discarded) break;
  }
  pool->Release(kSessionId, "").IgnoreError();  // NOT_FOUND once discarded
  return 0;
}
