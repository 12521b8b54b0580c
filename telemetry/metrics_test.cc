#include "telemetry/metrics.h"

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specserve::telemetry {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(MetricsTest, CounterRendersWithHelpAndType) {
  Registry r;
  Counter* c = r.AddCounter("vllm:prompt_tokens_total", "Prompt tokens.");
  c->Increment(3);
  c->Increment();
  EXPECT_EQ(c->Value(), 4);
  EXPECT_EQ(r.RenderText(),
            "# HELP vllm:prompt_tokens_total Prompt tokens.\n"
            "# TYPE vllm:prompt_tokens_total counter\n"
            "vllm:prompt_tokens_total 4\n");
}

TEST(MetricsTest, GaugeSetAndAdd) {
  Registry r;
  Gauge* g = r.AddGauge("queue", "Queued.");
  g->Set(5);
  g->Add(-2);
  g->Add(0.5);
  EXPECT_EQ(g->Value(), 3.5);
  EXPECT_THAT(r.RenderText(), HasSubstr("# TYPE queue gauge\nqueue 3.5\n"));
}

TEST(MetricsTest, SameNameAndLabelsReturnSameSeries) {
  Registry r;
  Counter* a = r.AddCounter("x_total", "X.", {{"position", "0"}});
  Counter* b = r.AddCounter("x_total", "X.", {{"position", "0"}});
  Counter* c = r.AddCounter("x_total", "X.", {{"position", "1"}});
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  a->Increment(2);
  c->Increment(7);
  const std::string text = r.RenderText();
  // One HELP/TYPE per family, one line per series.
  EXPECT_EQ(text,
            "# HELP x_total X.\n"
            "# TYPE x_total counter\n"
            "x_total{position=\"0\"} 2\n"
            "x_total{position=\"1\"} 7\n");
}

TEST(MetricsTest, LabelValuesAreEscaped) {
  Registry r;
  r.AddGauge("g", "G.", {{"reason", "a\"b\\c\nd"}, {"w", "127.0.0.1:1"}})
      ->Set(1);
  EXPECT_THAT(r.RenderText(),
              HasSubstr("g{reason=\"a\\\"b\\\\c\\nd\",w=\"127.0.0.1:1\"} 1\n"));
}

TEST(MetricsTest, HelpIsEscaped) {
  Registry r;
  r.AddGauge("g", "line1\nline2 back\\slash \"quotes stay\"");
  EXPECT_THAT(r.RenderText(),
              HasSubstr("# HELP g line1\\nline2 back\\\\slash \"quotes "
                        "stay\"\n"));
}

TEST(MetricsTest, HistogramBucketsAreCumulativeWithInf) {
  Registry r;
  Histogram* h =
      r.AddHistogram("lat_seconds", "Latency.", {0.1, 0.5, 1}, {{"w", "a"}});
  h->Observe(0.05);
  h->Observe(0.1);  // le is inclusive
  h->Observe(0.3);
  h->Observe(2);
  h->Observe(std::nan(""));  // ignored
  EXPECT_EQ(r.RenderText(),
            "# HELP lat_seconds Latency.\n"
            "# TYPE lat_seconds histogram\n"
            "lat_seconds_bucket{w=\"a\",le=\"0.1\"} 2\n"
            "lat_seconds_bucket{w=\"a\",le=\"0.5\"} 3\n"
            "lat_seconds_bucket{w=\"a\",le=\"1\"} 3\n"
            "lat_seconds_bucket{w=\"a\",le=\"+Inf\"} 4\n"
            "lat_seconds_sum{w=\"a\"} 2.45\n"
            "lat_seconds_count{w=\"a\"} 4\n");
}

TEST(MetricsTest, HistogramWithoutLabels) {
  Registry r;
  r.AddHistogram("h", "H.", {1})->Observe(5);
  EXPECT_THAT(r.RenderText(), HasSubstr("h_bucket{le=\"1\"} 0\n"
                                        "h_bucket{le=\"+Inf\"} 1\n"
                                        "h_sum 5\nh_count 1\n"));
}

TEST(MetricsTest, FamiliesRenderInRegistrationOrder) {
  Registry r;
  r.AddGauge("b", "B.");
  r.AddCounter("a_total", "A.");
  const std::string text = r.RenderText();
  EXPECT_LT(text.find("# HELP b "), text.find("# HELP a_total "));
}

TEST(MetricsTest, FormatMetricValue) {
  EXPECT_EQ(FormatMetricValue(0), "0");
  EXPECT_EQ(FormatMetricValue(42), "42");
  EXPECT_EQ(FormatMetricValue(-3), "-3");
  EXPECT_EQ(FormatMetricValue(12345678901.0), "12345678901");
  EXPECT_EQ(FormatMetricValue(0.1), "0.1");
  EXPECT_EQ(FormatMetricValue(0.25), "0.25");
  EXPECT_EQ(FormatMetricValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatMetricValue(-std::numeric_limits<double>::infinity()),
            "-Inf");
  EXPECT_EQ(FormatMetricValue(std::nan("")), "NaN");
  EXPECT_EQ(std::stod(FormatMetricValue(1.0 / 3)), 1.0 / 3);
}

TEST(MetricsTest, NameValidation) {
  EXPECT_TRUE(IsValidMetricName("vllm:num_requests_running"));
  EXPECT_TRUE(IsValidMetricName("_x1"));
  EXPECT_FALSE(IsValidMetricName("1x"));
  EXPECT_FALSE(IsValidMetricName("a-b"));
  EXPECT_FALSE(IsValidMetricName(""));
  EXPECT_TRUE(IsValidLabelName("finished_reason"));
  EXPECT_FALSE(IsValidLabelName("a:b"));
  EXPECT_FALSE(IsValidLabelName("__reserved"));
}

TEST(MetricsDeathTest, TypeClashIsABug) {
  Registry r;
  r.AddCounter("m_total", "M.");
  EXPECT_DEATH(r.AddGauge("m_total", "M."), "another type");
}

TEST(MetricsDeathTest, BadNameIsABug) {
  Registry r;
  EXPECT_DEATH(r.AddCounter("bad name", "M."), "bad metric name");
  EXPECT_DEATH(r.AddHistogram("h", "H.", {1}, {{"le", "x"}}), "reserved");
  EXPECT_DEATH(r.AddHistogram("h2", "H.", {2, 1}), "strictly increasing");
}

TEST(MetricsTest, ConcurrentUpdatesAreNotLost) {
  Registry r;
  Counter* c = r.AddCounter("c_total", "C.");
  Histogram* h = r.AddHistogram("h", "H.", {0.5});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&r, c, h, t] {
      for (int i = 0; i < 10000; ++i) {
        c->Increment();
        h->Observe(i % 2);
        if (i % 1000 == 0) {
          r.AddGauge("g", "G.", {{"t", std::to_string(t)}})->Add(1);
          r.RenderText();
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c->Value(), 40000);
  const Histogram::Snapshot s = h->Read();
  EXPECT_EQ(s.count, 40000u);
  EXPECT_EQ(s.counts[0], 20000u);
  EXPECT_EQ(s.sum, 20000);
  EXPECT_THAT(r.RenderText(), HasSubstr("g{t=\"3\"} 10\n"));
}

// Every non-comment line is `name{labels} value` with a parseable value.
TEST(MetricsTest, EveryLineIsWellFormed) {
  Registry r;
  r.AddCounter("a_total", "A.", {{"x", "y z"}})->Increment(1.5);
  r.AddHistogram("h", "H.", {0.001, 10})->Observe(3);
  r.AddGauge("g", "G.")->Set(-1e-9);
  for (absl::string_view line :
       absl::StrSplit(r.RenderText(), '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, "# HELP ") || absl::StartsWith(line, "# TYPE "))
      continue;
    const size_t space = line.rfind(' ');
    ASSERT_NE(space, absl::string_view::npos) << line;
    const std::string value(line.substr(space + 1));
    char* end = nullptr;
    std::strtod(value.c_str(), &end);
    EXPECT_TRUE(*end == '\0' || value == "+Inf" || value == "NaN") << line;
    EXPECT_THAT(std::string(line), Not(HasSubstr("\n")));
  }
}

}  // namespace
}  // namespace specserve::telemetry
