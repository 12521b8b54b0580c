#include "worker/spec/live_step_costs.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace specserve::spec {
namespace {

// The start-up table at `index` (from 0), extrapolated linearly from its last
// two entries past its end (flat with one entry); 0 for an empty table.
double StartupAt(const std::vector<double>& t, size_t index) {
  if (t.empty()) return 0;
  if (index < t.size()) return t[index];
  if (t.size() == 1) return t[0];
  const double last = t[t.size() - 1];
  const double slope = last - t[t.size() - 2];
  return std::max(last,
                  last + slope * static_cast<double>(index + 1 - t.size()));
}

}  // namespace

LiveStepCosts::LiveStepCosts(std::vector<double> startup_decode_by_batch,
                             std::vector<double> startup_verify_by_columns,
                             double weight)
    : weight_(std::clamp(weight, 1e-3, 1.0)) {
  decode_.startup = std::move(startup_decode_by_batch);
  round_.startup = std::move(startup_verify_by_columns);
}

void LiveStepCosts::Record(Column* c, int index, double seconds,
                           double weight) {
  if (index < 0 || !(seconds > 0) || !std::isfinite(seconds)) return;
  if (c->live.size() <= static_cast<size_t>(index)) c->live.resize(index + 1);
  double& v = c->live[index];
  v = v == 0 ? seconds : v + weight * (seconds - v);
}

void LiveStepCosts::RecordDecode(int batch, double seconds) {
  absl::MutexLock lock(&mu_);
  Record(&decode_, batch - 1, seconds, weight_);
}

void LiveStepCosts::RecordRound(int columns, int group_rows, double seconds) {
  if (columns < 2) return;
  absl::MutexLock lock(&mu_);
  // A round that shared its passes with other sessions' (a group of
  // group_rows verify rows) counts as a round alone would have cost: scaled
  // as the trunk pass scales between the two row counts (the gate scales it
  // back to the load it sees: scheduler/spec_gate.h "Cost").
  if (group_rows > columns) {
    const std::vector<double> decode = Fill(decode_);
    const double alone = StartupAt(decode, columns - 1);
    const double shared = StartupAt(decode, group_rows - 1);
    if (alone > 0 && shared > 0) seconds *= alone / shared;
  }
  Record(&round_, columns - 1, seconds, weight_);
}

std::vector<double> LiveStepCosts::Fill(const Column& c) {
  const size_t n = std::max(c.startup.size(), c.live.size());
  double log_ratio = 0;
  int measured = 0;
  for (size_t i = 0; i < c.live.size(); ++i) {
    const double base = StartupAt(c.startup, i);
    if (c.live[i] > 0 && base > 0) {
      log_ratio += std::log(c.live[i] / base);
      ++measured;
    }
  }
  const double scale = measured > 0 ? std::exp(log_ratio / measured) : 1.0;
  std::vector<double> out(n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    if (i < c.live.size() && c.live[i] > 0) {
      out[i] = c.live[i];
    } else {
      out[i] = StartupAt(c.startup, i) * scale;
    }
  }
  // Without a start-up table, unmeasured rows take the nearest measured
  // row below them (or above, for the first ones): never 0 inside a table.
  for (size_t i = 1; i < n; ++i) {
    if (out[i] == 0) out[i] = out[i - 1];
  }
  for (size_t i = n; i-- > 1;) {
    if (out[i - 1] == 0) out[i - 1] = out[i];
  }
  return out;
}

LiveStepCosts::Table LiveStepCosts::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return Table{Fill(decode_), Fill(round_)};
}

}  // namespace specserve::spec
