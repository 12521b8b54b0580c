#include "telemetry/scheduler_metrics.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specserve::telemetry {
namespace {

namespace v1 = specserve::v1;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(SchedulerMetricsTest, ExportsVllmNamesWithModelLabel) {
  SchedulerMetricsOptions options;
  options.model_name = "qwen3.5-tiny";
  options.max_k = 3;
  SchedulerMetrics m(options);
  m.num_requests_running()->Set(2);
  m.num_requests_waiting()->Set(1);
  m.prompt_tokens()->Increment(10);
  m.generation_tokens()->Increment(20);
  m.request_success(v1::STOP)->Increment();
  m.request_success(v1::CANCELLED)->Increment();
  m.time_to_first_token()->Observe(0.05);
  m.ObserveInterTokenLatency(0.002);
  m.e2e_request_latency()->Observe(1.2);
  m.kv_cache_usage_perc()->Set(0.25);
  const std::string text = m.RenderText();
  const std::string model = "{model_name=\"qwen3.5-tiny\"}";
  EXPECT_THAT(text, HasSubstr("# TYPE vllm:num_requests_running gauge\n"));
  EXPECT_THAT(text, HasSubstr("vllm:num_requests_running" + model + " 2\n"));
  EXPECT_THAT(text, HasSubstr("vllm:num_requests_waiting" + model + " 1\n"));
  EXPECT_THAT(text, HasSubstr("vllm:prompt_tokens_total" + model + " 10\n"));
  EXPECT_THAT(text,
              HasSubstr("vllm:generation_tokens_total" + model + " 20\n"));
  EXPECT_THAT(text, HasSubstr("vllm:kv_cache_usage_perc" + model + " 0.25\n"));
  EXPECT_THAT(text, HasSubstr("vllm:request_success_total{model_name=\"qwen3."
                              "5-tiny\",finished_reason=\"stop\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("finished_reason=\"abort\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("finished_reason=\"length\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE vllm:time_to_first_token_seconds "
                              "histogram\n"));
  EXPECT_THAT(text, HasSubstr("vllm:time_to_first_token_seconds_count" + model +
                              " 1\n"));
  EXPECT_THAT(text, HasSubstr("vllm:inter_token_latency_seconds_count" + model +
                              " 1\n"));
  EXPECT_THAT(text, HasSubstr("vllm:time_per_output_token_seconds_count" +
                              model + " 1\n"));
  EXPECT_THAT(text, HasSubstr("vllm:e2e_request_latency_seconds_bucket{"
                              "model_name=\"qwen3.5-tiny\",le=\"+Inf\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE vllm:request_queue_time_seconds "
                              "histogram\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE vllm:request_prompt_tokens histogram\n"));
}

TEST(SchedulerMetricsTest, TimePerOutputTokenPerChunkAndPerRequest) {
  // One request whose tokens came in three chunks after the first: vLLM
  // observes inter-token latency (and its deprecated alias
  // time_per_output_token) per chunk, and the per-request mean once.
  SchedulerMetricsOptions options;
  options.model_name = "m";
  SchedulerMetrics m(options);
  for (double s : {0.002, 0.004, 0.003}) m.ObserveInterTokenLatency(s);
  m.request_time_per_output_token()->Observe(0.003);
  const std::string text = m.RenderText();
  EXPECT_THAT(text, HasSubstr("vllm:inter_token_latency_seconds_count{"
                              "model_name=\"m\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("vllm:time_per_output_token_seconds_count{"
                              "model_name=\"m\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE vllm:request_time_per_output_token_"
                              "seconds histogram\n"));
  EXPECT_THAT(text, HasSubstr("vllm:request_time_per_output_token_seconds_"
                              "count{model_name=\"m\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("vllm:request_time_per_output_token_seconds_"
                              "sum{model_name=\"m\"} 0.003\n"));
}

TEST(SchedulerMetricsTest, SpecDecodeCountersFromTelemetryDelta) {
  SchedulerMetricsOptions options;
  options.max_k = 2;
  SchedulerMetrics m(options);
  v1::SessionTelemetry delta;
  delta.set_rounds(4);
  delta.set_drafted(12);
  delta.set_accepted(7);
  for (uint64_t v : {4, 4, 4}) delta.add_drafted_per_position(v);
  for (uint64_t v : {4, 2, 1}) delta.add_accepted_per_position(v);
  m.RecordSpecTelemetry(delta);
  m.RecordSpecTelemetry(delta);
  const std::string text = m.RenderText();
  EXPECT_THAT(text, HasSubstr("vllm:spec_decode_num_drafts_total 8\n"));
  EXPECT_THAT(text, HasSubstr("vllm:spec_decode_num_draft_tokens_total 24\n"));
  EXPECT_THAT(text,
              HasSubstr("vllm:spec_decode_num_accepted_tokens_total 14\n"));
  EXPECT_THAT(text, HasSubstr("vllm:spec_decode_num_accepted_tokens_per_pos_"
                              "total{position=\"0\"} 8\n"));
  EXPECT_THAT(text, HasSubstr("vllm:spec_decode_num_accepted_tokens_per_pos_"
                              "total{position=\"1\"} 4\n"));
  // Position 2 is past max_k: created on first use.
  EXPECT_THAT(text, HasSubstr("vllm:spec_decode_num_accepted_tokens_per_pos_"
                              "total{position=\"2\"} 2\n"));
}

TEST(SchedulerMetricsTest, OwnMetrics) {
  SchedulerMetrics m;
  m.sessions(v1::PARKED)->Set(3);
  m.gate_decisions(v1::BATCHED)->Increment();
  m.worker_available("127.0.0.1:50061")->Set(1);
  m.worker_available("127.0.0.1:50062")->Set(0);
  m.requests_rejected(absl::StatusCode::kResourceExhausted)->Increment(2);
  const std::string text = m.RenderText();
  EXPECT_THAT(text, HasSubstr("specserve_sessions{residency=\"parked\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("specserve_sessions{residency=\"lost\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("specserve_gate_decisions_total{decision="
                              "\"batched\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("specserve_gate_decisions_total{decision="
                              "\"speculative\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("specserve_worker_available{worker="
                              "\"127.0.0.1:50061\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("specserve_worker_available{worker="
                              "\"127.0.0.1:50062\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("specserve_requests_rejected_total{code="
                              "\"RESOURCE_EXHAUSTED\"} 2\n"));
  // No model label configured: vllm: series have no labels at all.
  EXPECT_THAT(text, HasSubstr("\nvllm:num_requests_running 0\n"));
  EXPECT_THAT(text, Not(HasSubstr("model_name")));
}

TEST(SchedulerMetricsTest, Labels) {
  EXPECT_EQ(FinishReasonLabel(v1::CONTEXT_FULL), "context_full");
  EXPECT_EQ(ResidencyLabel(v1::OFFLOADED), "offloaded");
  EXPECT_EQ(DecodeModeLabel(v1::SPECULATIVE), "speculative");
}

}  // namespace
}  // namespace specserve::telemetry
