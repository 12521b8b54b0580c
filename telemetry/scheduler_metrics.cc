#include "telemetry/scheduler_metrics.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace specserve::telemetry {
namespace {

namespace v1 = specserve::v1;

// vLLM's buckets (vllm/v1/metrics/loggers.py), with finer steps below 10 ms
// added to the inter-token ones: speculative rounds on a GPU deliver tokens
// faster than vLLM's first bucket.
const std::vector<double>& TtftBuckets() {
  static const auto* b = new std::vector<double>{
      0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
      1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
  return *b;
}

const std::vector<double>& InterTokenBuckets() {
  static const auto* b = new std::vector<double>{
      0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075,
      0.1,   0.15,   0.2,   0.3,    0.4,  0.5,   0.75, 1.0,
      2.5,   5.0,    7.5,   10.0,   20.0, 40.0,  80.0};
  return *b;
}

const std::vector<double>& RequestLatencyBuckets() {
  static const auto* b = new std::vector<double>{
      0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
      30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
  return *b;
}

// 1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's build_1_2_5_buckets).
std::vector<double> Buckets125(uint32_t max_value) {
  std::vector<double> out;
  for (double scale = 1;; scale *= 10) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (m * scale > max_value) return out;
      out.push_back(m * scale);
    }
  }
}

constexpr v1::FinishReason kFinishReasons[] = {v1::STOP, v1::LENGTH,
                                               v1::CONTEXT_FULL, v1::CANCELLED};
constexpr v1::Residency kResidencies[] = {
    v1::NEW, v1::ACTIVE, v1::PARKED, v1::OFFLOADED, v1::LOST, v1::CLOSED};
constexpr v1::DecodeMode kModes[] = {v1::SPECULATIVE, v1::BATCHED};

}  // namespace

std::string FinishReasonLabel(v1::FinishReason reason) {
  switch (reason) {
    case v1::STOP:
      return "stop";
    case v1::LENGTH:
      return "length";
    case v1::CONTEXT_FULL:
      return "context_full";
    case v1::CANCELLED:
      return "abort";
    default:
      return "unspecified";
  }
}

std::string ResidencyLabel(v1::Residency residency) {
  if (residency == v1::RESIDENCY_UNSPECIFIED) return "unspecified";
  return absl::AsciiStrToLower(v1::Residency_Name(residency));
}

std::string DecodeModeLabel(v1::DecodeMode mode) {
  if (mode == v1::DECODE_MODE_UNSPECIFIED) return "unspecified";
  return absl::AsciiStrToLower(v1::DecodeMode_Name(mode));
}

Labels SchedulerMetrics::ModelLabels(Labels extra) const {
  Labels labels;
  if (!options_.model_name.empty()) {
    labels.emplace_back("model_name", options_.model_name);
  }
  for (auto& label : extra) labels.push_back(std::move(label));
  return labels;
}

SchedulerMetrics::SchedulerMetrics(const SchedulerMetricsOptions& options)
    : options_(options), token_buckets_(Buckets125(options.max_context)) {
  const Labels model = ModelLabels();
  Registry& r = registry_;
  num_requests_running_ = r.AddGauge(
      kNumRequestsRunning, "Number of requests holding a running slot.", model);
  num_requests_waiting_ =
      r.AddGauge(kNumRequestsWaiting,
                 "Number of requests waiting to be processed.", model);
  kv_cache_usage_perc_ = r.AddGauge(
      kKvCacheUsagePerc,
      "Session cache memory in use over the budget, over available workers. "
      "1 means 100 percent usage.",
      model);
  prompt_tokens_ = r.AddCounter(kPromptTokensTotal,
                                "Number of prefill tokens processed.", model);
  generation_tokens_ = r.AddCounter(
      kGenerationTokensTotal, "Number of generation tokens processed.", model);
  for (v1::FinishReason reason : kFinishReasons) request_success(reason);
  request_prompt_tokens_ = r.AddHistogram(kRequestPromptTokens,
                                          "Number of prefill tokens processed.",
                                          token_buckets_, model);
  request_generation_tokens_ = r.AddHistogram(
      kRequestGenerationTokens, "Number of generation tokens processed.",
      token_buckets_, model);
  time_to_first_token_ = r.AddHistogram(
      kTimeToFirstToken, "Histogram of time to first token in seconds.",
      TtftBuckets(), model);
  inter_token_latency_ = r.AddHistogram(
      kInterTokenLatency, "Histogram of inter-token latency in seconds.",
      InterTokenBuckets(), model);
  time_per_output_token_ = r.AddHistogram(
      kTimePerOutputToken,
      "Histogram of time per output token in seconds. DEPRECATED: Use "
      "vllm:inter_token_latency_seconds instead.",
      InterTokenBuckets(), model);
  request_time_per_output_token_ =
      r.AddHistogram(kRequestTimePerOutputToken,
                     "Histogram of time_per_output_token_seconds per request.",
                     InterTokenBuckets(), model);
  e2e_request_latency_ = r.AddHistogram(
      kE2eRequestLatency, "Histogram of e2e request latency in seconds.",
      RequestLatencyBuckets(), model);
  request_queue_time_ = r.AddHistogram(
      kRequestQueueTime,
      "Histogram of time spent in the admission queue for request.",
      RequestLatencyBuckets(), model);
  spec_decode_num_drafts_ = r.AddCounter(
      kSpecDecodeNumDrafts, "Number of spec decoding drafts.", model);
  spec_decode_num_draft_tokens_ =
      r.AddCounter(kSpecDecodeNumDraftTokens, "Number of draft tokens.", model);
  spec_decode_num_accepted_tokens_ = r.AddCounter(
      kSpecDecodeNumAcceptedTokens, "Number of accepted tokens.", model);
  for (uint32_t pos = 0; pos < options_.max_k; ++pos) {
    spec_decode_num_accepted_tokens_per_pos(pos);
  }
  for (v1::Residency residency : kResidencies) sessions(residency);
  for (v1::DecodeMode mode : kModes) gate_decisions(mode);
}

void SchedulerMetrics::ObserveInterTokenLatency(double seconds) {
  inter_token_latency_->Observe(seconds);
  time_per_output_token_->Observe(seconds);
}

Counter* SchedulerMetrics::request_success(v1::FinishReason reason) {
  return registry_.AddCounter(
      kRequestSuccessTotal, "Count of successfully processed requests.",
      ModelLabels({{"finished_reason", FinishReasonLabel(reason)}}));
}

Counter* SchedulerMetrics::spec_decode_num_accepted_tokens_per_pos(
    uint32_t position) {
  return registry_.AddCounter(
      kSpecDecodeNumAcceptedTokensPerPos, "Accepted tokens per draft position.",
      ModelLabels({{"position", absl::StrCat(position)}}));
}

void SchedulerMetrics::RecordSpecTelemetry(const v1::SessionTelemetry& delta) {
  spec_decode_num_drafts_->Increment(static_cast<double>(delta.rounds()));
  spec_decode_num_draft_tokens_->Increment(
      static_cast<double>(delta.drafted()));
  spec_decode_num_accepted_tokens_->Increment(
      static_cast<double>(delta.accepted()));
  for (int i = 0; i < delta.accepted_per_position_size(); ++i) {
    if (delta.accepted_per_position(i) == 0) continue;
    spec_decode_num_accepted_tokens_per_pos(static_cast<uint32_t>(i))
        ->Increment(static_cast<double>(delta.accepted_per_position(i)));
  }
}

Gauge* SchedulerMetrics::sessions(v1::Residency residency) {
  return registry_.AddGauge(kSessions, "Sessions by residency.",
                            {{"residency", ResidencyLabel(residency)}});
}

Counter* SchedulerMetrics::gate_decisions(v1::DecodeMode decision) {
  return registry_.AddCounter(kGateDecisionsTotal,
                              "Spec gate decisions, by the mode chosen.",
                              {{"decision", DecodeModeLabel(decision)}});
}

Gauge* SchedulerMetrics::worker_available(absl::string_view address) {
  return registry_.AddGauge(kWorkerAvailable,
                            "1 while the worker is available, else 0.",
                            {{"worker", std::string(address)}});
}

Counter* SchedulerMetrics::requests_rejected(absl::StatusCode code) {
  return registry_.AddCounter(
      kRequestsRejectedTotal,
      "Requests refused before reaching a worker, by status code.",
      {{"code", absl::StatusCodeToString(code)}});
}

}  // namespace specserve::telemetry
