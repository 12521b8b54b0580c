#include "telemetry/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace specserve::telemetry {
namespace {

bool IsNameStart(char c, bool allow_colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         (allow_colon && c == ':');
}

bool IsNameChar(char c, bool allow_colon) {
  return IsNameStart(c, allow_colon) || (c >= '0' && c <= '9');
}

bool IsValidName(absl::string_view name, bool allow_colon) {
  if (name.empty() || !IsNameStart(name[0], allow_colon)) return false;
  for (char c : name) {
    if (!IsNameChar(c, allow_colon)) return false;
  }
  return true;
}

// Renders {a="x",b="y"} (or nothing when there are no labels); `extra` is an
// additional label rendered last (the histogram's `le`).
std::string RenderLabels(const Labels& labels, absl::string_view extra_name,
                         absl::string_view extra_value) {
  if (labels.empty() && extra_name.empty()) return "";
  std::string out = "{";
  bool first = true;
  for (const auto& [name, value] : labels) {
    if (!first) out += ",";
    first = false;
    absl::StrAppend(&out, name, "=\"", EscapeLabelValue(value), "\"");
  }
  if (!extra_name.empty()) {
    if (!first) out += ",";
    absl::StrAppend(&out, extra_name, "=\"", extra_value, "\"");
  }
  out += "}";
  return out;
}

const char* TypeName(int type) {
  switch (type) {
    case 0:
      return "counter";
    case 1:
      return "gauge";
    default:
      return "histogram";
  }
}

// Adds `delta` to an atomic double (no fetch_add for floating point in C++17).
void AtomicAdd(std::atomic<double>* target, double delta) {
  double old = target->load(std::memory_order_relaxed);
  while (!target->compare_exchange_weak(old, old + delta,
                                        std::memory_order_relaxed)) {
  }
}

}  // namespace

void Counter::Increment(double delta) {
  DCHECK_GE(delta, 0.0) << "counters only go up";
  if (!(delta >= 0.0)) return;  // also drops NaN
  AtomicAdd(&value_, delta);
}

void Gauge::Add(double delta) { AtomicAdd(&value_, delta); }

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    CHECK(std::isfinite(bounds_[i])) << "histogram bounds must be finite";
    CHECK(i == 0 || bounds_[i - 1] < bounds_[i])
        << "histogram bounds must be strictly increasing";
  }
  absl::MutexLock lock(&mu_);
  counts_.assign(bounds_.size() + 1, 0);
}

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;  // would poison the sum forever
  // First bucket whose upper bound is >= value (Prometheus buckets are `le`).
  const size_t index =
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  absl::MutexLock lock(&mu_);
  ++counts_[index];
  sum_ += value;
  ++count_;
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.bounds = bounds_;
  absl::MutexLock lock(&mu_);
  s.counts = counts_;
  s.sum = sum_;
  s.count = count_;
  return s;
}

Registry::Series* Registry::GetSeries(absl::string_view name,
                                      absl::string_view help, Type type,
                                      const std::vector<double>& bounds,
                                      const Labels& labels) {
  CHECK(IsValidMetricName(name)) << "bad metric name '" << name << "'";
  for (const auto& [label, value] : labels) {
    CHECK(IsValidLabelName(label))
        << "bad label name '" << label << "' on " << name;
    CHECK(!(type == Type::kHistogram && label == "le"))
        << "'le' is reserved on histogram " << name;
  }
  Family* family;
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    auto owned = std::make_unique<Family>();
    owned->name = std::string(name);
    owned->help = std::string(help);
    owned->type = type;
    owned->bounds = bounds;
    family = owned.get();
    by_name_.emplace(owned->name, family);
    families_.push_back(std::move(owned));
  } else {
    family = it->second;
    CHECK(family->type == type)
        << "metric " << name << " registered again with another type";
    CHECK(family->bounds == bounds)
        << "histogram " << name << " registered again with other buckets";
  }
  auto series_it = family->by_labels.find(labels);
  if (series_it != family->by_labels.end()) return series_it->second;

  auto series = std::make_unique<Series>();
  series->labels = labels;
  switch (type) {
    case Type::kCounter:
      series->counter = std::make_unique<Counter>();
      break;
    case Type::kGauge:
      series->gauge = std::make_unique<Gauge>();
      break;
    case Type::kHistogram:
      series->histogram = std::make_unique<Histogram>(bounds);
      break;
  }
  Series* raw = series.get();
  family->by_labels.emplace(labels, raw);
  family->series.push_back(std::move(series));
  return raw;
}

Counter* Registry::AddCounter(absl::string_view name, absl::string_view help,
                              const Labels& labels) {
  absl::MutexLock lock(&mu_);
  return GetSeries(name, help, Type::kCounter, {}, labels)->counter.get();
}

Gauge* Registry::AddGauge(absl::string_view name, absl::string_view help,
                          const Labels& labels) {
  absl::MutexLock lock(&mu_);
  return GetSeries(name, help, Type::kGauge, {}, labels)->gauge.get();
}

Histogram* Registry::AddHistogram(absl::string_view name,
                                  absl::string_view help,
                                  std::vector<double> bounds,
                                  const Labels& labels) {
  absl::MutexLock lock(&mu_);
  return GetSeries(name, help, Type::kHistogram, bounds, labels)
      ->histogram.get();
}

std::string Registry::RenderText() const {
  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& family : families_) {
    absl::StrAppend(&out, "# HELP ", family->name, " ",
                    EscapeHelp(family->help), "\n");
    absl::StrAppend(&out, "# TYPE ", family->name, " ",
                    TypeName(static_cast<int>(family->type)), "\n");
    for (const auto& series : family->series) {
      switch (family->type) {
        case Type::kCounter:
          absl::StrAppend(&out, family->name,
                          RenderLabels(series->labels, "", ""), " ",
                          FormatMetricValue(series->counter->Value()), "\n");
          break;
        case Type::kGauge:
          absl::StrAppend(&out, family->name,
                          RenderLabels(series->labels, "", ""), " ",
                          FormatMetricValue(series->gauge->Value()), "\n");
          break;
        case Type::kHistogram: {
          const Histogram::Snapshot s = series->histogram->Read();
          uint64_t cumulative = 0;
          for (size_t i = 0; i <= s.bounds.size(); ++i) {
            cumulative += s.counts[i];
            const std::string le = i < s.bounds.size()
                                       ? FormatMetricValue(s.bounds[i])
                                       : std::string("+Inf");
            absl::StrAppend(&out, family->name, "_bucket",
                            RenderLabels(series->labels, "le", le), " ",
                            cumulative, "\n");
          }
          const std::string labels = RenderLabels(series->labels, "", "");
          absl::StrAppend(&out, family->name, "_sum", labels, " ",
                          FormatMetricValue(s.sum), "\n");
          absl::StrAppend(&out, family->name, "_count", labels, " ", s.count,
                          "\n");
          break;
        }
      }
    }
  }
  return out;
}

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Integers up to 2^53 are exact in a double: print them without exponent so
  // large counters stay readable and exact.
  if (value == std::floor(value) && std::fabs(value) < 9007199254740992.0) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.17g", value);
  // %.17g round-trips but shows noise (0.10000000000000001); prefer the
  // shortest of %.15g/%.17g that reads back as the same double.
  char short_buf[32];
  std::snprintf(short_buf, sizeof(short_buf), "%.15g", value);
  if (std::strtod(short_buf, nullptr) == value) return short_buf;
  return buf;
}

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string EscapeHelp(absl::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

bool IsValidMetricName(absl::string_view name) {
  return IsValidName(name, /*allow_colon=*/true);
}

bool IsValidLabelName(absl::string_view name) {
  return IsValidName(name, /*allow_colon=*/false) &&
         !(name.size() >= 2 && name[0] == '_' && name[1] == '_');
}

}  // namespace specserve::telemetry
