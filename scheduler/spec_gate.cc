#include "scheduler/spec_gate.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace specserve::scheduler {
namespace {

namespace v1 = specserve::v1;

// Table value at index n >= 1 (table[n-1]); past the end, linear in the last
// two entries with a non-negative slope; with one entry, `single_entry_slope`
// times that entry per step.
double Extrapolate(absl::Span<const double> table, uint32_t n,
                   double single_entry_slope) {
  if (table.empty()) return 0;
  if (n == 0) n = 1;
  if (n <= table.size()) return table[n - 1];
  const size_t last = table.size() - 1;
  const double slope = table.size() >= 2
                           ? std::max(0.0, table[last] - table[last - 1])
                           : table[last] * single_entry_slope;
  return table[last] + slope * static_cast<double>(n - table.size());
}

}  // namespace

double DecodeSeconds(absl::Span<const double> by_batch, uint32_t batch) {
  return Extrapolate(by_batch, batch, /*single_entry_slope=*/0.0);
}

double VerifySeconds(absl::Span<const double> by_columns, uint32_t columns) {
  return Extrapolate(by_columns, columns, /*single_entry_slope=*/1.0);
}

double SmoothedAcceptance(double drafted, double accepted,
                          const SpecGateConfig& config) {
  drafted = std::max(0.0, drafted);
  const double acc = std::clamp(accepted, 0.0, drafted);
  const double w = std::max(0.0, config.prior_weight);
  const double denom = drafted + w;
  if (denom <= 0) return std::clamp(config.prior_acceptance, 0.0, 1.0);
  return std::clamp((acc + config.prior_acceptance * w) / denom, 0.0, 1.0);
}

double AcceptanceUpperBound(double drafted, double accepted, double z) {
  if (drafted <= 0) return 1.0;
  const double n = drafted;
  const double r = std::clamp(accepted, 0.0, n) / n;
  const double z2 = z * z;
  const double centre = r + z2 / (2 * n);
  const double spread = z * std::sqrt(r * (1 - r) / n + z2 / (4 * n * n));
  return std::clamp((centre + spread) / (1 + z2 / n), 0.0, 1.0);
}

double GroupRoundSeconds(absl::Span<const double> decode_seconds_by_batch,
                         absl::Span<const double> verify_seconds_by_columns,
                         uint32_t k, uint32_t batch) {
  const double alone = DecodeSeconds(decode_seconds_by_batch, k + 1);
  if (alone <= 0) return 0;
  return VerifySeconds(verify_seconds_by_columns, k + 1) *
         DecodeSeconds(decode_seconds_by_batch, batch * (k + 1)) / alone;
}

v1::GateDecision SpecGateDecision::ToProto() const {
  v1::GateDecision p;
  p.set_mode(mode);
  p.set_measured_acceptance(measured_acceptance);
  p.set_expected_tokens_per_round(expected_tokens_per_round);
  p.set_verify_cost_ratio(verify_cost_ratio);
  p.set_batch_size(batch_size);
  p.set_reason(reason);
  return p;
}

SpecGateDecision DecideSpec(const SpecGateInputs& in,
                            const SpecGateConfig& config) {
  SpecGateDecision d;
  const uint32_t k = std::max<uint32_t>(1, in.k);
  const uint32_t b = std::max<uint32_t>(1, in.batch_size);
  d.batch_size = b;
  // The recent window: lifetime counts that went down belong to a session
  // started over (rebuilt), so all of them are new.
  const bool restarted = in.drafted < in.state.seen_drafted ||
                         in.accepted < in.state.seen_accepted;
  const double new_drafted = static_cast<double>(
      restarted ? in.drafted : in.drafted - in.state.seen_drafted);
  const double new_accepted = static_cast<double>(
      restarted ? in.accepted : in.accepted - in.state.seen_accepted);
  // An exponential window over drafted tokens: the new counts (spread over
  // their drafts) enter with weight W/δ·(1 − e^(−δ/W)) ≈ 1 for δ ≪ W, so the
  // window holds about the last W drafts however large one step is.
  const double w = std::max(1.0, config.acceptance_window);
  const double keep = std::exp(-new_drafted / w);
  const double enter = new_drafted > 0 ? w / new_drafted * (1.0 - keep) : 1.0;
  d.next_state = in.state;
  d.next_state.seen_drafted = in.drafted;
  d.next_state.seen_accepted = in.accepted;
  d.next_state.recent_drafted =
      in.state.recent_drafted * keep + new_drafted * enter;
  d.next_state.recent_accepted =
      in.state.recent_accepted * keep + new_accepted * enter;
  // The prior stands in for rounds not yet run: its weight fades as the
  // session's lifetime drafts grow past the window.
  SpecGateConfig faded = config;
  faded.prior_weight =
      config.prior_weight * w / (w + static_cast<double>(in.drafted));
  d.measured_acceptance = SmoothedAcceptance(
      d.next_state.recent_drafted, d.next_state.recent_accepted, faded);
  d.expected_tokens_per_round = 1.0 + d.measured_acceptance * k;

  if (!in.speculation_requested) {
    d.mode = v1::BATCHED;
    d.reason = "speculation not requested";
    return d;
  }
  if (!in.draft_available) {
    d.mode = v1::BATCHED;
    d.reason = "the model has no draft (MTP) head";
    return d;
  }
  if (in.current_mode == v1::BATCHED) {
    d.mode = v1::BATCHED;
    d.reason = "demotion is one-way: the session stays batched";
    return d;
  }

  const double decode = DecodeSeconds(in.decode_seconds_by_batch, b);
  const double verify = VerifySeconds(in.verify_seconds_by_columns, k + 1);
  if (decode <= 0 || verify <= 0) {
    d.mode = v1::SPECULATIVE;
    d.reason = "no step costs from the worker yet: speculating by default";
    return d;
  }
  // The round runs in a group with the other sessions' rounds (one verify
  // of about b·(k+1) rows, draft passes of b rows).
  d.verify_cost_ratio = GroupRoundSeconds(in.decode_seconds_by_batch,
                                          in.verify_seconds_by_columns, k, b) /
                        decode;
  const double gain = d.expected_tokens_per_round / d.verify_cost_ratio;
  const double threshold = 1.0 - config.margin;
  const std::string numbers = absl::StrFormat(
      "E=%.2f tokens/round vs a round costing %.2f decode steps at batch %d "
      "(gain %.2f)",
      d.expected_tokens_per_round, d.verify_cost_ratio, b, gain);

  if (gain >= threshold) {
    d.mode = v1::SPECULATIVE;
    d.next_state.below_count = 0;
    d.reason = "speculation pays: " + numbers;
    return d;
  }
  if (in.current_mode != v1::SPECULATIVE) {
    // First decision: nothing to flap between.
    d.mode = v1::BATCHED;
    d.reason = "plain decode is cheaper: " + numbers;
    return d;
  }
  d.next_state.below_count = in.state.below_count + 1;
  // Evidence needs rounds: before the first, the streak decides.
  if (config.decisive_z > 0 && in.drafted > 0) {
    const double best = AcceptanceUpperBound(static_cast<double>(in.drafted),
                                             static_cast<double>(in.accepted),
                                             config.decisive_z);
    // Load comes and goes (the streak is for that): the evidence is decisive
    // only if the round would lose alone on the worker.
    const double alone_ratio =
        verify / DecodeSeconds(in.decode_seconds_by_batch, 1);
    const double best_gain = (1.0 + best * k) / alone_ratio;
    if (best_gain < threshold) {
      d.mode = v1::BATCHED;
      d.reason = absl::StrFormat(
          "demoted at once: even acceptance %.3f (the upper bound of %d of %d "
          "drafts) gives gain %.2f < %.2f alone on the worker: %s",
          best, in.accepted, in.drafted, best_gain, threshold, numbers);
      return d;
    }
  }
  if (d.next_state.below_count >= std::max<uint32_t>(1, config.demote_after)) {
    d.mode = v1::BATCHED;
    d.reason = absl::StrFormat("demoted after %d evaluations below %.2f: %s",
                               d.next_state.below_count, threshold, numbers);
    return d;
  }
  d.mode = v1::SPECULATIVE;
  d.reason =
      absl::StrFormat("below %.2f (%d of %d before demotion): %s", threshold,
                      d.next_state.below_count, config.demote_after, numbers);
  return d;
}

uint32_t ChooseKByPosition(absl::Span<const uint64_t> drafted_per_position,
                           absl::Span<const uint64_t> accepted_per_position,
                           uint32_t max_k, uint32_t batch,
                           absl::Span<const double> decode_seconds_by_batch,
                           absl::Span<const double> verify_seconds_by_columns,
                           uint64_t min_rounds) {
  max_k = std::max<uint32_t>(1, max_k);
  batch = std::max<uint32_t>(1, batch);
  if (decode_seconds_by_batch.empty() || verify_seconds_by_columns.empty() ||
      drafted_per_position.size() < max_k ||
      accepted_per_position.size() < max_k) {
    return max_k;
  }
  for (uint32_t j = 0; j < max_k; ++j) {
    if (drafted_per_position[j] < min_rounds) return max_k;
  }
  uint32_t best_k = max_k;
  double best = -1;
  double tokens = 1.0;
  for (uint32_t k = 1; k <= max_k; ++k) {
    tokens += static_cast<double>(std::min(accepted_per_position[k - 1],
                                           drafted_per_position[k - 1])) /
              static_cast<double>(drafted_per_position[k - 1]);
    const double cost = GroupRoundSeconds(decode_seconds_by_batch,
                                          verify_seconds_by_columns, k, batch);
    if (cost <= 0) continue;
    // Strictly better only: ties keep the smaller k (less draft work).
    if (tokens / cost > best * (1 + 1e-9)) {
      best = tokens / cost;
      best_k = k;
    }
  }
  return best_k;
}

}  // namespace specserve::scheduler
