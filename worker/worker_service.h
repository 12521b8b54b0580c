// The worker's gRPC service (specserve.worker.v1.Worker), callback API.
//
// Sessions live in the SessionPool; the SpecEngine runs admits, bursts,
// flushes, rewinds and demotions on them; every model call goes through one
// ModelExecutor (serialized, plain-decode steps of concurrent bursts batched).
// RPCs that run the model or take a session from the pool do so on their own
// thread: reactions never block, so gRPC's callback threads stay free for
// Health and GetWorkerInfo, which never wait on the model or the pool (the
// scheduler's liveness polls: a busy worker must not look down).
// Every session call and the scheduler's claiming GetWorkerInfo renew the
// session lease; idle sessions are released once it runs out
// (worker/scheduler_lease.h).
// A running burst can be asked to stop at its next round boundary
// (StopBurst): it then ends like any other burst, with its summary, so the
// scheduler learns exactly what was committed.
// Every session call names the session's owner, and a Burst may name the
// history length the copy must hold: the checks of proto/worker.proto that
// keep a caller who is not the session's scheduler from changing it.
#ifndef SPECSERVE_WORKER_WORKER_SERVICE_H_
#define SPECSERVE_WORKER_WORKER_SERVICE_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/worker.grpc.pb.h"
#include "worker/grammar/grammar.h"
#include "worker/model/model.h"
#include "worker/scheduler_lease.h"
#include "worker/session_pool.h"
#include "worker/spec/live_step_costs.h"
#include "worker/spec/model_executor.h"
#include "worker/spec/spec_engine.h"

namespace specserve::worker {

struct WorkerOptions {
  std::string device = "cpu";  // "cpu" or "cuda:N"
  uint32_t default_capacity = 4096;
  SessionPoolOptions pool;
  // States saved inside prompts for prefix reuse (spec_engine.h).
  spec::PrefixCheckpointOptions prefix_checkpoints;
  // Honour BurstRequest.inject_nan_at (tests of docs/RELIABILITY.md row 8).
  bool enable_fault_injection = false;
  specserve::worker::v1::StepCosts costs;  // measured at start-up
  // Report step costs as measured while serving (spec::LiveStepCosts, seeded
  // by `costs`) instead of `costs` as they are. Off for fixed --step_costs.
  bool live_costs = true;
  // Idle sessions are released once no scheduler has called for this long
  // (worker/scheduler_lease.h); zero: never.
  absl::Duration session_lease = absl::Seconds(60);
  // LoadModel: called with a checked model directory after the answer is
  // decided; the process then restarts on it (worker_main). Null: LoadModel
  // answers FAILED_PRECONDITION.
  std::function<void(const std::string& model_dir)> on_load_model;
  // Compiles the grammars of structured_output requests for this model
  // (worker/grammar); null: they are UNIMPLEMENTED (no tokenizer.json).
  std::shared_ptr<grammar::GrammarCompiler> grammars;
};

class WorkerService final
    : public specserve::worker::v1::Worker::CallbackService {
 public:
  // `model` must outlive the service.
  WorkerService(WorkerOptions options, model::Model* model);

  grpc::ServerUnaryReactor* GetWorkerInfo(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::WorkerInfoRequest* request,
      specserve::worker::v1::WorkerInfo* response) override;
  grpc::ServerUnaryReactor* Admit(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::AdmitRequest* request,
      specserve::worker::v1::SessionState* response) override;
  grpc::ServerWriteReactor<specserve::worker::v1::BurstEvent>* Burst(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::BurstRequest* request) override;
  grpc::ServerUnaryReactor* StopBurst(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::SessionRef* request,
      specserve::worker::v1::StopBurstResponse* response) override;
  grpc::ServerUnaryReactor* Flush(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::SessionRef* request,
      specserve::worker::v1::SessionState* response) override;
  grpc::ServerUnaryReactor* Park(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::SessionRef* request,
      specserve::worker::v1::SessionState* response) override;
  // worker/worker_service_fork.cc.
  grpc::ServerUnaryReactor* ForkSession(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::ForkSessionRequest* request,
      specserve::worker::v1::SessionState* response) override;
  grpc::ServerUnaryReactor* Resume(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::SessionRef* request,
      specserve::worker::v1::SessionState* response) override;
  grpc::ServerUnaryReactor* Rewind(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::SessionRef* request,
      specserve::worker::v1::SessionState* response) override;
  grpc::ServerUnaryReactor* Demote(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::SessionRef* request,
      specserve::worker::v1::SessionState* response) override;
  grpc::ServerUnaryReactor* Release(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::SessionRef* request,
      specserve::worker::v1::ReleaseResponse* response) override;
  grpc::ServerUnaryReactor* GetSessionState(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::SessionRef* request,
      specserve::worker::v1::SessionState* response) override;
  grpc::ServerUnaryReactor* LoadModel(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::LoadModelRequest* request,
      specserve::worker::v1::LoadModelResponse* response) override;

 private:
  // Rows of a new session (Admit, ForkSession): `requested`, or the default
  // for 0; INVALID_ARGUMENT past the model's context.
  absl::StatusOr<int> NewSessionCapacity(uint32_t requested) const;
  // What a draining worker answers new work with.
  static grpc::Status Draining();
  using SessionOp = std::function<absl::Status(spec::SpecSession*)>;
  // Runs `op` on a leased session on its own thread, then answers with the
  // session's state. `idle_residency`: answer with where the session is
  // once back in the pool (PARKED or OFFLOADED; NOT_FOUND if the pool
  // dropped it at once), rather than RESIDENT as seen while leased.
  grpc::ServerUnaryReactor* RunSessionOp(
      grpc::CallbackServerContext* ctx,
      const specserve::worker::v1::SessionRef& ref,
      specserve::worker::v1::SessionState* response, SessionOp op,
      bool idle_residency = false);
  specserve::worker::v1::SessionState StateOf(const spec::SpecSession& s,
                                              bool busy);
  using StopFlag = std::shared_ptr<std::atomic<bool>>;
  void RunBurst(grpc::CallbackServerContext* ctx,
                specserve::worker::v1::BurstRequest request,
                SessionPool::Lease lease, class BurstWriter* writer,
                StopFlag stop);

  const WorkerOptions options_;
  model::Model* const model_;
  const specserve::v1::ModelInfo model_info_;
  // WorkerInfo.instance: random per process start.
  const uint64_t instance_;
  // Before executor_: outlives every forward call that records into it.
  const std::unique_ptr<spec::LiveStepCosts> live_costs_;
  spec::ModelExecutor executor_;
  spec::SpecEngine engine_;
  SessionPool pool_;
  // After pool_: its thread stops before the pool goes.
  SchedulerLease lease_;
  std::atomic<int> active_bursts_{0};
  // The stop flag of each running burst, by session id, with the owner a
  // StopBurst must name. An entry lives exactly while the burst holds the
  // session's lease (at most one burst per session), so a StopBurst never
  // reaches a later burst.
  struct RunningBurst {
    StopFlag stop;
    std::string owner;
  };
  absl::Mutex stops_mu_;
  std::map<std::string, RunningBurst> stops_ ABSL_GUARDED_BY(stops_mu_);
};

}  // namespace specserve::worker

#endif  // SPECSERVE_WORKER_WORKER_SERVICE_H_
