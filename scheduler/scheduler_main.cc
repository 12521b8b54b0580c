// specserve_scheduler: the public specserve.v1 API. Connects to the workers it
// is given, watches their health, and (as the issues land) owns sessions,
// admission, the spec gate and the tokenizer. Health and reflection on; SIGTERM
// drains.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"
#include "proto/api_limits.h"
#include "scheduler/admin_service.h"
#include "scheduler/admission.h"
#include "scheduler/authenticator.h"
#include "scheduler/idle_poller.h"
#include "scheduler/load_model.h"
#include "scheduler/placement.h"
#include "scheduler/prefix_reuse.h"
#include "scheduler/public_services.h"
#include "scheduler/reflection_auth.h"
#include "scheduler/request_registry.h"
#include "scheduler/residency_sync.h"
#include "scheduler/scheduler_context.h"
#include "scheduler/session_table.h"
#include "scheduler/tokenizer/tokenizer.h"
#include "scheduler/vllm_engine/vllm_engine_service.h"
#include "scheduler/worker_pool.h"
#include "telemetry/metrics_http.h"
#include "telemetry/reload_signal.h"
#include "telemetry/scheduler_metrics.h"
#include "telemetry/server_lifecycle.h"
#include "telemetry/sync_health.h"
#include "telemetry/tls_credentials.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "Address to serve specserve.v1 on (host:port; port 0 picks a free "
          "port, printed on stdout).");
ABSL_FLAG(std::string, workers, "127.0.0.1:50061",
          "Comma-separated worker addresses (host:port).");
ABSL_FLAG(std::string, model, "models/default",
          "Model directory (the scheduler reads tokenizer.json from it).");
ABSL_FLAG(std::string, served_model_name, "",
          "The model_name label of the vllm: metrics (vLLM's "
          "--served-model-name), fixed for the process's life: Admin."
          "LoadModel does not change it. Empty = the last component of "
          "--model.");
ABSL_FLAG(int, worker_poll_ms, 500,
          "How often worker health is polled, in milliseconds.");
ABSL_FLAG(int, worker_poll_deadline_ms, 500,
          "A health poll not answered within this is a miss; "
          "--worker_down_after_misses misses in a row mark the worker "
          "unavailable.");
ABSL_FLAG(int, worker_down_after_misses, 2,
          "Consecutive missed health polls that mark a worker unavailable: "
          "new work goes elsewhere and calls in flight to it are cancelled "
          "(a suspect worker is polled again at once). A worker whose port "
          "refuses connections is marked unavailable at once; a burst that "
          "is cancelled, passes its deadline or runs slow never marks it.");
ABSL_FLAG(int, no_worker_wait_ms, 5000,
          "How long a request that finds no available worker waits for one "
          "(within its own deadline) before failing UNAVAILABLE; 0 = fail at "
          "once.");
ABSL_FLAG(int, worker_lost_after_ms, 10000,
          "A worker that has not answered for this long (hung) has its "
          "sessions marked LOST; one that cannot be reached at all (its "
          "process is gone) loses them at once.");
ABSL_FLAG(int, drain_grace_seconds, 30,
          "On a drain (SIGTERM or Admin.Drain): seconds in-flight requests "
          "get to finish before they are stopped at a round boundary "
          "(final event CANCELLED).");
ABSL_FLAG(int, metrics_port, -1,
          "Serve Prometheus metrics on http://127.0.0.1:PORT/metrics "
          "(0 = a free port, printed; -1 = off).");
ABSL_FLAG(int, max_running, 64, "Requests running at once.");
ABSL_FLAG(int, max_queued, 256,
          "Requests waiting for a slot before RESOURCE_EXHAUSTED.");
ABSL_FLAG(int, burst_tokens, 32, "Tokens per burst dispatched to a worker.");
ABSL_FLAG(int, default_k, 3,
          "Draft depth when a request gives none: 1..kMaxDraftDepth "
          "(proto/api_limits.h).");
ABSL_FLAG(bool, gateway_speculation, true,
          "Requests of the SMG gateway's engine protocol "
          "(vllm.grpc.engine.VllmEngine), which has no field for it, ask for "
          "speculative decoding (the spec gate still decides per burst).");
ABSL_FLAG(int, gateway_k, 0,
          "Draft depth of gateway requests: 1..kMaxDraftDepth "
          "(proto/api_limits.h); 0 = --default_k.");
ABSL_FLAG(int, default_session_capacity, 1024,
          "Rows of a session opened without a capacity.");
ABSL_FLAG(int, prefix_cache_sessions, 16,
          "Automatic prefix reuse (docs/DESIGN.md \"Prefix reuse\"): how "
          "many finished one-shot requests stay parked on their workers as "
          "checkpoints (least recently used released first); their prefixes "
          "and those of parked sessions then seed new requests. 0: off.");
ABSL_FLAG(int, prefix_cache_entries, 4096,
          "Sessions (kept one-shot requests and client sessions) whose "
          "reusable positions the prefix tree indexes.");
ABSL_FLAG(double, prefix_balance_sessions, 2,
          "Prefix-aware placement (scheduler/placement.h): load imbalance, in "
          "sessions, that any prefix hit outweighs; a new session resumes on "
          "the worker holding its prompt's prefix only while that worker is "
          "at most this plus --prefix_tokens_per_session's worth busier than "
          "the least loaded one (or within --prefix_balance_ratio of it), "
          "else it is prefilled on the least loaded one.");
ABSL_FLAG(double, prefix_tokens_per_session, 1024,
          "Prompt tokens a prefix hit saves prefilling that outweigh one more "
          "session of load imbalance (0: a hit's length adds nothing).");
ABSL_FLAG(double, prefix_balance_ratio, 1.25,
          "A prefix holder whose load is at most this multiple of the least "
          "loaded worker's keeps the session whatever the difference.");
ABSL_FLAG(int, session_idle_ttl_seconds, 3600,
          "Idle sessions are closed after this long.");
ABSL_FLAG(bool, enable_fault_injection, false,
          "Tests only: forward the request metadata x-specserve-inject-nan-at "
          "(the n-th generated token gets NaN logits) to the workers, which "
          "honour it only with their own --enable_fault_injection.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain for the public port: serve TLS only (with "
          "--tls_key). Empty = plaintext.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA: every client must present a certificate it signed "
          "(mutual TLS on the public port). Needs --tls_cert.");
ABSL_FLAG(std::string, worker_tls_ca, "",
          "PEM CA that signed the workers' certificates: talk TLS to every "
          "worker and refuse one whose certificate it did not sign. Empty = "
          "plaintext to the workers.");
ABSL_FLAG(std::string, worker_tls_cert, "",
          "PEM client certificate the scheduler presents to the workers "
          "(their --tls_client_ca must have signed it). Needs "
          "--worker_tls_ca.");
ABSL_FLAG(std::string, worker_tls_key, "",
          "PEM private key of --worker_tls_cert.");
ABSL_FLAG(std::string, worker_tls_server_name, "",
          "Name to check on the workers' certificates when it differs from "
          "the host in --workers (e.g. certificates for localhost, workers "
          "at 127.0.0.1). Needs --worker_tls_ca.");
ABSL_FLAG(std::string, auth_tokens, "",
          "File of bearer tokens, one 'TOKEN TENANT ROLE' per line (ROLE: "
          "user or admin; blank lines and # comments allowed). Every RPC but "
          "grpc.health.v1 then needs the metadata 'authorization: Bearer "
          "TOKEN'; sessions and requests belong to the token's tenant; "
          "LoadModel, Drain and Abort of all need admin. Read again on "
          "SIGHUP (a bad file keeps the tokens in force). Empty = no "
          "authentication: one tenant, every caller an admin.");
ABSL_FLAG(std::string, worker_owner, "",
          "The owner token this scheduler's sessions carry on the workers "
          "(proto/worker.proto): a worker refuses calls on them without it. "
          "Empty (the default) = a random one per start; give one only to "
          "inspect sessions on a worker by hand (tests).");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "specserve_scheduler --listen HOST:PORT --workers HOST:PORT[,...] "
      "--model DIR");
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  // Debian's Abseil is built without NDEBUG, which leaves Mutex deadlock
  // detection on: every lock then updates a global lock graph, gRPC's own
  // locks included (gpr_mu is an absl::Mutex), several times per token.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  std::vector<std::string> addresses =
      absl::StrSplit(absl::GetFlag(FLAGS_workers), ',', absl::SkipEmpty());
  if (addresses.empty()) {
    LOG(ERROR) << "--workers: give at least one worker address";
    return 2;
  }
  namespace sched = specserve::scheduler;
  // Every k a request can end up with is within the workers' limit: a
  // request's own is checked at admission, these when the server starts.
  if (const int k = absl::GetFlag(FLAGS_default_k);
      k < 1 || k > specserve::kMaxDraftDepth) {
    LOG(ERROR) << "--default_k " << k << " is outside 1.."
               << specserve::kMaxDraftDepth << " (the draft depth limit)";
    return 2;
  }
  if (const int k = absl::GetFlag(FLAGS_gateway_k);
      k < 0 || k > specserve::kMaxDraftDepth) {
    LOG(ERROR) << "--gateway_k " << k << " is outside 0.."
               << specserve::kMaxDraftDepth
               << " (the draft depth limit; 0 = --default_k)";
    return 2;
  }

  // Transport security, checked before anything starts: a bad TLS flag
  // fails at once rather than serving plaintext.
  specserve::telemetry::ServerTlsFiles public_tls;
  public_tls.cert = absl::GetFlag(FLAGS_tls_cert);
  public_tls.key = absl::GetFlag(FLAGS_tls_key);
  public_tls.client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  auto public_credentials =
      specserve::telemetry::MakeServerCredentials(public_tls);
  if (!public_credentials.ok()) {
    LOG(ERROR) << public_credentials.status().message();
    return 2;
  }
  specserve::telemetry::ChannelTlsFiles worker_tls;
  worker_tls.ca = absl::GetFlag(FLAGS_worker_tls_ca);
  worker_tls.cert = absl::GetFlag(FLAGS_worker_tls_cert);
  worker_tls.key = absl::GetFlag(FLAGS_worker_tls_key);
  worker_tls.server_name = absl::GetFlag(FLAGS_worker_tls_server_name);
  auto worker_security = specserve::telemetry::MakeChannelSecurity(worker_tls);
  if (!worker_security.ok()) {
    LOG(ERROR) << "--worker_tls_*: " << worker_security.status().message();
    return 2;
  }
  const std::string listen = absl::GetFlag(FLAGS_listen);
  if (!public_tls.enabled() &&
      !specserve::telemetry::IsLoopbackListenAddress(listen)) {
    LOG(WARNING) << "serving plaintext on " << listen
                 << ", which is not a loopback address: requests and "
                    "responses cross the network unencrypted; give "
                    "--tls_cert and --tls_key";
  }

  // Bearer tokens, read before anything starts: a malformed file fails here,
  // naming its line. SIGHUP reads it again (housekeeping, below).
  sched::Authenticator auth;
  specserve::telemetry::InstallReloadSignalHandler();
  if (const std::string path = absl::GetFlag(FLAGS_auth_tokens);
      !path.empty()) {
    if (absl::Status s = auth.Load(path); !s.ok()) {
      LOG(ERROR) << "--auth_tokens: " << s.message();
      return 2;
    }
    LOG(INFO) << "bearer tokens from " << path
              << ": every RPC but health needs one";
  } else if (!specserve::telemetry::IsLoopbackListenAddress(listen)) {
    LOG(WARNING) << "no --auth_tokens on " << listen
                 << ", which is not a loopback address: anyone who can "
                    "reach it can use every RPC, admin ones included";
  }

  // The tokenizer is optional: without tokenizer.json the API takes ids only.
  auto loaded_tokenizer = sched::LoadModelTokenizer(absl::GetFlag(FLAGS_model));
  if (!loaded_tokenizer.ok()) {
    LOG(ERROR) << loaded_tokenizer.status();
    return 1;
  }
  std::shared_ptr<const specserve::tokenizer::Tokenizer> tokenizer =
      std::move(*loaded_tokenizer);
  if (tokenizer == nullptr) {
    LOG(WARNING) << absl::GetFlag(FLAGS_model)
                 << "/tokenizer.json not found: text input disabled";
  }

  specserve::telemetry::SchedulerMetricsOptions metrics_options;
  metrics_options.model_name = absl::GetFlag(FLAGS_served_model_name);
  if (metrics_options.model_name.empty()) {
    metrics_options.model_name =
        sched::ModelDirName(absl::GetFlag(FLAGS_model));
  }
  specserve::telemetry::SchedulerMetrics metrics(metrics_options);
  sched::SessionTableOptions table_options;
  table_options.default_capacity =
      absl::GetFlag(FLAGS_default_session_capacity);
  table_options.max_capacity =
      1 << 24;  // the model context is checked per request
  sched::SessionTable sessions(table_options);
  // Declared after the table: the pool's monitor threads, which update it,
  // stop first.
  sched::ResidencySync residency_sync(&sessions);
  sched::WorkerPoolOptions pool_options;
  pool_options.poll_interval =
      absl::Milliseconds(absl::GetFlag(FLAGS_worker_poll_ms));
  pool_options.poll_deadline =
      absl::Milliseconds(absl::GetFlag(FLAGS_worker_poll_deadline_ms));
  pool_options.lost_after =
      absl::Milliseconds(absl::GetFlag(FLAGS_worker_lost_after_ms));
  pool_options.down_after_misses =
      absl::GetFlag(FLAGS_worker_down_after_misses);
  if (pool_options.down_after_misses < 1 ||
      absl::GetFlag(FLAGS_no_worker_wait_ms) < 0) {
    LOG(ERROR) << "--worker_down_after_misses must be >= 1 and "
                  "--no_worker_wait_ms >= 0";
    return 2;
  }
  pool_options.security = *worker_security;
  pool_options.owner = absl::GetFlag(FLAGS_worker_owner);
  if (pool_options.owner.empty()) {
    absl::StatusOr<std::string> owner = sched::NewRandomId("own_");
    if (!owner.ok()) {
      LOG(ERROR) << "cannot choose a worker owner token: " << owner.status();
      return 1;
    }
    pool_options.owner = *std::move(owner);
  }
  sched::WorkerPool pool(addresses, pool_options, &residency_sync);
  sched::AdmissionOptions admission_options;
  admission_options.max_running = absl::GetFlag(FLAGS_max_running);
  admission_options.max_queued = absl::GetFlag(FLAGS_max_queued);
  sched::AdmissionController admission(admission_options);
  sched::RequestRegistry requests;

  sched::SchedulerContext context;
  context.options.burst_tokens = absl::GetFlag(FLAGS_burst_tokens);
  context.options.default_k = absl::GetFlag(FLAGS_default_k);
  context.options.no_worker_wait =
      absl::Milliseconds(absl::GetFlag(FLAGS_no_worker_wait_ms));
  context.options.session_idle_ttl =
      absl::Seconds(absl::GetFlag(FLAGS_session_idle_ttl_seconds));
  context.options.enable_fault_injection =
      absl::GetFlag(FLAGS_enable_fault_injection);
  context.workers = &pool;
  context.sessions = &sessions;
  context.admission = &admission;
  context.SetTokenizer(tokenizer);
  context.metrics = &metrics;
  context.requests = &requests;
  context.auth = &auth;
  std::unique_ptr<sched::PrefixReuse> prefix_reuse;
  if (absl::GetFlag(FLAGS_prefix_cache_sessions) > 0) {
    sched::PrefixCacheOptions prefix_options;
    prefix_options.max_owned = absl::GetFlag(FLAGS_prefix_cache_sessions);
    prefix_options.max_sessions = std::max<size_t>(
        prefix_options.max_owned,
        std::max(0, absl::GetFlag(FLAGS_prefix_cache_entries)));
    sched::PlacementOptions placement;
    placement.prefix_balance_sessions =
        absl::GetFlag(FLAGS_prefix_balance_sessions);
    placement.prefix_tokens_per_session =
        absl::GetFlag(FLAGS_prefix_tokens_per_session);
    placement.prefix_balance_ratio = absl::GetFlag(FLAGS_prefix_balance_ratio);
    prefix_reuse = std::make_unique<sched::PrefixReuse>(
        prefix_options, &metrics.registry(), placement);
    context.prefix = prefix_reuse.get();
  }

  specserve::telemetry::MetricsHttpServer metrics_http(
      [&metrics] { return metrics.RenderText(); },
      [] { return !specserve::telemetry::DrainRequested(); });
  if (absl::GetFlag(FLAGS_metrics_port) >= 0) {
    auto port = metrics_http.Start(absl::GetFlag(FLAGS_metrics_port));
    if (!port.ok()) {
      LOG(ERROR) << "metrics: " << port.status();
      return 1;
    }
    std::printf("specserve_scheduler metrics on port %d\n", *port);
  }

  // Housekeeping: idle-session expiry, the gauges that mirror state, and
  // the reload of --auth_tokens after a SIGHUP.
  absl::Notification stop_housekeeping;
  std::thread housekeeping([&] {
    uint64_t reloads_seen = 0;
    while (
        !stop_housekeeping.WaitForNotificationWithTimeout(absl::Seconds(1))) {
      if (const uint64_t n = specserve::telemetry::ReloadSignalCount();
          n != reloads_seen) {
        reloads_seen = n;
        if (!auth.enabled()) {
          LOG(INFO) << "SIGHUP: nothing to reload (no --auth_tokens)";
        } else if (absl::StatusOr<size_t> loaded = auth.Reload(); loaded.ok()) {
          LOG(INFO) << "SIGHUP: reloaded " << *loaded << " credential(s) from "
                    << absl::GetFlag(FLAGS_auth_tokens);
        } else {
          LOG(ERROR) << "SIGHUP: " << loaded.status().message()
                     << "; the credentials in force stay";
        }
      }
      for (const auto& e :
           sessions.ExpireIdle(context.options.session_idle_ttl)) {
        if (e.worker >= 0) pool.ReleaseNowOrLater(e.worker, e.id);
      }
      // Every residency is set, zero included: a count that fell to zero
      // (every PARKED session LOST) must not keep showing its last value.
      std::map<specserve::v1::Residency, int> counts =
          sessions.CountByResidency();
      for (specserve::v1::Residency r :
           {specserve::v1::NEW, specserve::v1::ACTIVE, specserve::v1::PARKED,
            specserve::v1::OFFLOADED, specserve::v1::LOST}) {
        metrics.sessions(r)->Set(counts[r]);
      }
      uint64_t used = 0, budget = 0;
      for (int i = 0; i < pool.size(); ++i) {
        metrics.worker_available(pool.address(i))
            ->Set(pool.Available(i) ? 1 : 0);
        const auto info = pool.Info(i);
        used += info.memory_used_bytes();
        budget += info.memory_budget_bytes();
      }
      metrics.kv_cache_usage_perc()->Set(budget ? double(used) / budget : 0.0);
      if (prefix_reuse != nullptr) prefix_reuse->UpdateGauges(pool);
    }
  });

  specserve::telemetry::EnableHealthAndReflection();
  specserve::telemetry::InstallDrainSignalHandlers();

  sched::AdminService admin(&context);
  sched::GenerationService generation(&context);
  sched::SessionsService sessions_service(&context);
  sched::TokenizationService tokenization(&context);
  sched::vllm_engine::VllmEngineOptions vllm_options;
  vllm_options.gateway.speculation = absl::GetFlag(FLAGS_gateway_speculation);
  vllm_options.gateway.k = absl::GetFlag(FLAGS_gateway_k);
  vllm_options.served_model_name = metrics_options.model_name;
  vllm_options.model_dir = absl::GetFlag(FLAGS_model);
  vllm_options.max_running = admission_options.max_running;
  sched::vllm_engine::VllmEngineService vllm_engine(&context, vllm_options);

  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, *public_credentials, &port);
  // Room for the largest text input the API accepts (Limits::max_text_bytes,
  // checked with a clear INVALID_ARGUMENT): gRPC's default 4 MiB cap refused
  // larger requests first, as RESOURCE_EXHAUSTED, which reads as "retry".
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(context.limits.max_text_bytes) + (1 << 20));
  // Every service here is synchronous, health included: one callback
  // service would start gRPC's callback threads, which poll every socket and
  // hand each event between themselves (telemetry/sync_health.h). Each call
  // runs on a thread of the synchronous server's pool, whose idle threads
  // wait without polling: only idle_poller's thread (or a streaming
  // request's) polls the sockets.
  specserve::telemetry::InstallSyncHealthService(&builder);
  sched::IdlePoller idle_poller(&builder);
  if (auth.enabled()) {
    // Reflection needs a token too: its handlers are gRPC's own, so an
    // interceptor checks it (scheduler/reflection_auth.h).
    std::vector<
        std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors;
    interceptors.push_back(
        std::make_unique<sched::ReflectionAuthInterceptorFactory>(&auth));
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  builder.RegisterService(&admin);
  builder.RegisterService(&generation);
  builder.RegisterService(&sessions_service);
  builder.RegisterService(&tokenization);
  builder.RegisterService(&vllm_engine);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    LOG(ERROR) << "cannot listen on " << listen
               << (public_tls.enabled() ? " (with TLS: does --tls_key belong "
                                          "to --tls_cert?)"
                                        : "");
    // A joinable std::thread destroyed by the return would abort.
    stop_housekeeping.Notify();
    housekeeping.join();
    return 1;
  }
  context.idle_poller = &idle_poller;
  idle_poller.Start();
  std::printf("specserve_scheduler listening on port %d\n", port);
  std::fflush(stdout);

  // At the end of the drain grace, requests still running are aborted: each
  // stops its burst at the next round boundary and ends with a final event
  // (CANCELLED), its session parked (bounded by the bursts' stop grace).
  auto cut_off = [&requests] {
    requests.AbortAll();
    const absl::Time until = absl::Now() + absl::Seconds(5);
    while (specserve::telemetry::InFlightCount() > 0 && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(10));
    }
  };
  specserve::telemetry::ServeUntilDrained(
      server.get(),
      {"specserve.v1.Generation", "specserve.v1.Sessions",
       "specserve.v1.Tokenization", "specserve.v1.Admin",
       "vllm.grpc.engine.VllmEngine"},
      absl::Seconds(absl::GetFlag(FLAGS_drain_grace_seconds)), cut_off);
  idle_poller.Stop();
  // Requests the cut-off did not end still run on the server's handler
  // threads and use what main() owns (admission, sessions, workers): stop
  // them and wait before tearing that down (destroying the admission
  // controller under a live ticket aborted the process). One stuck in a
  // worker call past the bound would touch freed state: exit without
  // destructors instead.
  requests.AbortAll();
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (specserve::telemetry::InFlightCount() > 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  if (specserve::telemetry::InFlightCount() > 0) {
    LOG(WARNING) << specserve::telemetry::InFlightCount()
                 << " request(s) did not stop; exiting without cleanup";
    std::fflush(nullptr);
    std::_Exit(0);
  }
  stop_housekeeping.Notify();
  housekeeping.join();
  metrics_http.Stop();
  return 0;
}
