// A small Prometheus metrics registry: counters, gauges and fixed-bucket
// histograms, each series optionally labelled, rendered in the Prometheus text
// exposition format (version 0.0.4) by Registry::RenderText() for GET /metrics
// (telemetry/metrics_http.h serves it).
//
// Usage:
//   Registry registry;
//   Counter* tokens = registry.AddCounter("vllm:generation_tokens_total",
//                                         "Generated tokens.");
//   tokens->Increment(5);
//   Gauge* up = registry.AddGauge("specserve_worker_available", "...",
//                                 {{"worker", "127.0.0.1:50061"}});
//   up->Set(1);
//
// A metric family is one name with one type and one help text; each distinct
// label set under it is one series. Asking again for an existing (name, labels)
// returns the same series, so labelled series can be looked up on demand from
// any thread. Names are used exactly as given (counter names should end in
// `_total`, as prometheus_client renders them).
//
// Invariants:
// - Series pointers returned by the registry stay valid for the registry's
//   lifetime (series are never removed).
// - Re-registering a name with another type or another histogram bucket list is
//   a programming error (CHECK).
// - Metric and label names must match Prometheus' grammar (CHECK); label values
//   may be any UTF-8 and are escaped on output.
// All operations are thread-safe.
#ifndef SPECSERVE_TELEMETRY_METRICS_H_
#define SPECSERVE_TELEMETRY_METRICS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace specserve::telemetry {

// Label pairs (name, value) of one series, in the order they are rendered.
using Labels = std::vector<std::pair<std::string, std::string>>;

// A monotonically increasing value (requests, tokens).
class Counter {
 public:
  // `delta` must be >= 0 (a negative delta is a bug: DCHECK, ignored in opt).
  void Increment(double delta = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down (queue length, availability).
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double delta);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Observations counted into fixed cumulative buckets (upper bounds `le`), plus
// their sum and count. Bounds are strictly increasing and finite; the +Inf
// bucket is implicit.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);

  void Observe(double value);

  struct Snapshot {
    std::vector<double> bounds;
    // Non-cumulative count per bucket; size bounds.size() + 1 (last = +Inf).
    std::vector<uint64_t> counts;
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Read() const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  Counter* AddCounter(absl::string_view name, absl::string_view help,
                      const Labels& labels = {});
  Gauge* AddGauge(absl::string_view name, absl::string_view help,
                  const Labels& labels = {});
  // Every series of one histogram family must use the same bounds.
  Histogram* AddHistogram(absl::string_view name, absl::string_view help,
                          std::vector<double> bounds,
                          const Labels& labels = {});

  // The whole registry in Prometheus text format 0.0.4: families in
  // registration order, each with # HELP and # TYPE, series in creation order.
  std::string RenderText() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Series {
    Labels labels;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };
  struct Family {
    std::string name;
    std::string help;
    Type type;
    std::vector<double> bounds;  // histograms only
    std::vector<std::unique_ptr<Series>> series;
    std::map<Labels, Series*> by_labels;
  };

  // Finds or creates the series; creates the family on first use.
  Series* GetSeries(absl::string_view name, absl::string_view help, Type type,
                    const std::vector<double>& bounds, const Labels& labels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Family>> families_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Family*, std::less<>> by_name_ ABSL_GUARDED_BY(mu_);
};

// Text-format helpers, exposed for tests.
// A sample value: integers exactly, other values with round-trip precision,
// and +Inf / -Inf / NaN spelled as Prometheus expects.
std::string FormatMetricValue(double value);
// Escapes a label value: backslash, double quote and newline.
std::string EscapeLabelValue(absl::string_view value);
// Escapes a HELP text: backslash and newline.
std::string EscapeHelp(absl::string_view help);
bool IsValidMetricName(absl::string_view name);
bool IsValidLabelName(absl::string_view name);

}  // namespace specserve::telemetry

#endif  // SPECSERVE_TELEMETRY_METRICS_H_
