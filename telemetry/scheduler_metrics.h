// Every metric the scheduler exports, created up front in one Registry, so the
// scheduler has one object to pass around and GET /metrics renders them all.
//
// Names follow vLLM's V1 engine (v0.10/v0.11, vllm/v1/metrics/loggers.py and
// vllm/v1/spec_decode/metrics.py) where the meaning matches, as rendered by
// prometheus_client: counters carry the `_total` suffix in the exposition
// (vllm:prompt_tokens_total, vllm:spec_decode_num_drafts_total, ...), and
// every vllm: series carries a `model_name` label when one is configured.
// Dashboards and routers written for vLLM (e.g. rate(...accepted_tokens_total)
// / rate(...draft_tokens_total)) therefore work unchanged. Our own metrics are
// prefixed `specserve_`.
//
// Labelled series that depend on enums (finish reason, residency, decision,
// draft position) are created at construction so they render as 0 before the
// first event; per-worker and per-status-code series are created on first use.
// Thread-safe: every accessor may be called from any thread.
#ifndef SPECSERVE_TELEMETRY_SCHEDULER_METRICS_H_
#define SPECSERVE_TELEMETRY_SCHEDULER_METRICS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/api_limits.h"
#include "proto/specserve.pb.h"
#include "telemetry/metrics.h"

namespace specserve::telemetry {

struct SchedulerMetricsOptions {
  // Value of the `model_name` label on vllm: series; empty = no such label.
  std::string model_name;
  // Upper end of the 1-2-5 buckets of the token-count histograms.
  uint32_t max_context = 262144;
  // Draft positions whose per-position series exist from the start
  // (0..max_k-1): every position a round can reach.
  uint32_t max_k = kMaxDraftDepth;
};

// Label values used for the enum-labelled series (exposed for tests and for
// callers that build queries).
// vLLM's finished_reason values: "stop", "length", "abort"; CONTEXT_FULL has
// no vLLM equivalent and is "context_full".
std::string FinishReasonLabel(specserve::v1::FinishReason reason);
// "new", "active", "parked", "offloaded", "lost", "closed".
std::string ResidencyLabel(specserve::v1::Residency residency);
// "speculative", "batched".
std::string DecodeModeLabel(specserve::v1::DecodeMode mode);

class SchedulerMetrics {
 public:
  explicit SchedulerMetrics(const SchedulerMetricsOptions& options = {});
  SchedulerMetrics(const SchedulerMetrics&) = delete;
  SchedulerMetrics& operator=(const SchedulerMetrics&) = delete;

  Registry& registry() { return registry_; }
  std::string RenderText() const { return registry_.RenderText(); }

  // --- vLLM-compatible -----------------------------------------------------
  // Requests holding a running slot / waiting in the admission queue.
  Gauge* num_requests_running() const { return num_requests_running_; }
  Gauge* num_requests_waiting() const { return num_requests_waiting_; }
  // Session memory in use over the budget, summed over available workers;
  // 1 = full.
  Gauge* kv_cache_usage_perc() const { return kv_cache_usage_perc_; }
  Counter* prompt_tokens() const { return prompt_tokens_; }
  Counter* generation_tokens() const { return generation_tokens_; }
  Histogram* time_to_first_token() const { return time_to_first_token_; }
  // Time between consecutive token deliveries of one request; recorded under
  // both vLLM names (inter_token_latency_seconds and the deprecated
  // time_per_output_token_seconds, which vLLM V1 observes per token too) so
  // old and new dashboards work.
  void ObserveInterTokenLatency(double seconds);
  // Once per finished request: its mean time per output token after the
  // first, (last token time - first token time) / (tokens - 1), 0 with fewer
  // than two tokens (vLLM's mean_time_per_output_token).
  Histogram* request_time_per_output_token() const {
    return request_time_per_output_token_;
  }
  Histogram* e2e_request_latency() const { return e2e_request_latency_; }
  Histogram* request_queue_time() const { return request_queue_time_; }
  Histogram* request_prompt_tokens() const { return request_prompt_tokens_; }
  Histogram* request_generation_tokens() const {
    return request_generation_tokens_;
  }
  // A finished request (any FinishReason, including CANCELLED = "abort").
  Counter* request_success(specserve::v1::FinishReason reason);
  // vllm:spec_decode_*: drafts (= rounds), drafted and accepted tokens, and
  // accepted tokens per draft position (label position = 0-based index).
  Counter* spec_decode_num_drafts() const { return spec_decode_num_drafts_; }
  Counter* spec_decode_num_draft_tokens() const {
    return spec_decode_num_draft_tokens_;
  }
  Counter* spec_decode_num_accepted_tokens() const {
    return spec_decode_num_accepted_tokens_;
  }
  Counter* spec_decode_num_accepted_tokens_per_pos(uint32_t position);
  // Adds one burst's telemetry delta to the spec_decode counters.
  void RecordSpecTelemetry(const specserve::v1::SessionTelemetry& delta);

  // --- specserve -----------------------------------------------------------
  // Sessions by residency (set from the session table's counts).
  Gauge* sessions(specserve::v1::Residency residency);
  // Spec-gate decisions by chosen mode.
  Counter* gate_decisions(specserve::v1::DecodeMode decision);
  // 1 while the worker at `address` is available, else 0.
  Gauge* worker_available(absl::string_view address);
  // Requests refused before any work, by gRPC status code name
  // (e.g. code="RESOURCE_EXHAUSTED").
  Counter* requests_rejected(absl::StatusCode code);

 private:
  Labels ModelLabels(Labels extra = {}) const;

  const SchedulerMetricsOptions options_;
  Registry registry_;
  Gauge* num_requests_running_;
  Gauge* num_requests_waiting_;
  Gauge* kv_cache_usage_perc_;
  Counter* prompt_tokens_;
  Counter* generation_tokens_;
  Histogram* time_to_first_token_;
  Histogram* inter_token_latency_;
  Histogram* time_per_output_token_;
  Histogram* request_time_per_output_token_;
  Histogram* e2e_request_latency_;
  Histogram* request_queue_time_;
  Histogram* request_prompt_tokens_;
  Histogram* request_generation_tokens_;
  Counter* spec_decode_num_drafts_;
  Counter* spec_decode_num_draft_tokens_;
  Counter* spec_decode_num_accepted_tokens_;
  std::vector<double> token_buckets_;
};

// Metric names (as exposed), for callers and tests.
inline constexpr char kNumRequestsRunning[] = "vllm:num_requests_running";
inline constexpr char kNumRequestsWaiting[] = "vllm:num_requests_waiting";
inline constexpr char kKvCacheUsagePerc[] = "vllm:kv_cache_usage_perc";
inline constexpr char kPromptTokensTotal[] = "vllm:prompt_tokens_total";
inline constexpr char kGenerationTokensTotal[] = "vllm:generation_tokens_total";
inline constexpr char kTimeToFirstToken[] = "vllm:time_to_first_token_seconds";
inline constexpr char kInterTokenLatency[] = "vllm:inter_token_latency_seconds";
inline constexpr char kTimePerOutputToken[] =
    "vllm:time_per_output_token_seconds";
inline constexpr char kRequestTimePerOutputToken[] =
    "vllm:request_time_per_output_token_seconds";
inline constexpr char kE2eRequestLatency[] = "vllm:e2e_request_latency_seconds";
inline constexpr char kRequestQueueTime[] = "vllm:request_queue_time_seconds";
inline constexpr char kRequestPromptTokens[] = "vllm:request_prompt_tokens";
inline constexpr char kRequestGenerationTokens[] =
    "vllm:request_generation_tokens";
inline constexpr char kRequestSuccessTotal[] = "vllm:request_success_total";
inline constexpr char kSpecDecodeNumDrafts[] =
    "vllm:spec_decode_num_drafts_total";
inline constexpr char kSpecDecodeNumDraftTokens[] =
    "vllm:spec_decode_num_draft_tokens_total";
inline constexpr char kSpecDecodeNumAcceptedTokens[] =
    "vllm:spec_decode_num_accepted_tokens_total";
inline constexpr char kSpecDecodeNumAcceptedTokensPerPos[] =
    "vllm:spec_decode_num_accepted_tokens_per_pos_total";
inline constexpr char kSessions[] = "specserve_sessions";
inline constexpr char kGateDecisionsTotal[] = "specserve_gate_decisions_total";
inline constexpr char kWorkerAvailable[] = "specserve_worker_available";
inline constexpr char kRequestsRejectedTotal[] =
    "specserve_requests_rejected_total";

}  // namespace specserve::telemetry

#endif  // SPECSERVE_TELEMETRY_SCHEDULER_METRICS_H_
