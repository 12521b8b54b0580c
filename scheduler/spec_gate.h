// The spec gate (docs/DESIGN.md §4): per session, speculative rounds or plain
// batched decode, as a pure function of explicit inputs — the
// session's measured acceptance, its draft depth k, the worker's measured step
// costs, the worker's current batch size, the current mode and a small
// hysteresis state the caller keeps on the session (SessionTable does).
//
// The model.
//   Acceptance. r = accepted / drafted over the session's recent rounds: the
//   counts since the last evaluation are added to a window that forgets
//   exponentially per drafted token (e^(−new drafted / window)), so r follows
//   the last ~`acceptance_window` drafts and a session whose drafts stop
//   landing is seen within a few bursts. It is smoothed toward a prior for
//   sessions with few rounds: r^ = (accepted + r0·w') / (drafted + w'), the
//   prior's weight w' = w·W / (W + lifetime drafted) fading as the session
//   runs (W = acceptance_window).
//   Tokens per round. E = 1 + r^·k. This is not an approximation: with k
//   drafts per round, the mean accepted count per round is r·k by the
//   definition of r, plus the bonus token (it is vLLM's "mean acceptance
//   length"). The depth itself is chosen from the per-position acceptance
//   (ChooseKByPosition).
//   Cost. With b sessions on the worker, plain decode gives every session one
//   token per batched step of D(b) seconds. The speculative sessions' rounds
//   run as one group (worker/spec/round_group.cc): one verify of about
//   b·(k+1) rows and k draft passes of b rows, so a session gets E tokens
//   per group. A group costs what a round alone does, V(k+1), scaled as the
//   trunk pass scales from k+1 rows to b·(k+1): V(k+1)·D(b·(k+1))/D(k+1)
//   (on a memory-bound GPU nearly V(k+1) up to dozens of rows; on a
//   compute-bound host about b·V(k+1)). V(c) is a whole round of c columns
//   alone: k draft steps, the verify and the MTP rows, measured while
//   serving and recorded as its round alone (worker/spec/live_step_costs.h),
//   the start-up probe's bare verify until then. Hence
//     verify_cost_ratio = V(k+1)·D(b·(k+1)) / (D(k+1)·D(b))
//                                          (a round's cost in plain steps)
//     speculation pays  ⇔  E > verify_cost_ratio  ⇔  gain = E / ratio > 1.
//   Costs past the end of a worker's table are extrapolated linearly from its
//   last two entries (flat for decode, proportional for verify with a single
//   entry: both err toward plain decode).
//
// Hysteresis. A speculative session is demoted only after `demote_after`
// consecutive evaluations with gain < 1 − margin; one good evaluation resets
// the count. A first decision (current mode UNSPECIFIED) needs no streak.
// Decisive evidence skips the streak: when even the optimistic acceptance,
// the upper Wilson bound (z = `decisive_z`) of the session's lifetime
// accepted / drafted without the prior, gives gain < 1 − margin for a round
// alone on the worker (V(k+1) / D(1): load comes and goes, and the streak is
// for that), the session is demoted at that evaluation. The streak guards
// against noise in a rate that is near the line; a lifetime bound far below it
// is not noise (drafts that never land, as with an untrained head, are seen
// after one burst instead of four), and a session whose drafts once landed
// keeps a high lifetime bound, so the streak still decides for it. Demotion is
// one-way (docs/DESIGN.md §1): a BATCHED session stays BATCHED.
#ifndef SPECSERVE_SCHEDULER_SPEC_GATE_H_
#define SPECSERVE_SCHEDULER_SPEC_GATE_H_

#include <cstdint>
#include <string>

#include "absl/types/span.h"
#include "proto/specserve.pb.h"

namespace specserve::scheduler {

struct SpecGateConfig {
  // Prior acceptance and its weight in pseudo-drafted tokens.
  double prior_acceptance = 0.6;
  double prior_weight = 16;
  // Drafted tokens over which the measured acceptance forgets by 1/e.
  double acceptance_window = 128;
  // Demote when gain < 1 - margin (a speculative session then costs at most
  // ~1/(1 - margin) of plain decode while the streak builds) ...
  double margin = 0.04;
  // ... for this many consecutive evaluations, unless the evidence is
  // decisive (see Hysteresis above; 0 turns that rule off).
  uint32_t demote_after = 3;
  double decisive_z = 1.64;
};

// Kept per session between evaluations; starts zeroed.
struct SpecGateState {
  // Consecutive evaluations of a speculative session below 1 - margin.
  uint32_t below_count = 0;
  // The session's lifetime counts at the last evaluation, and the recent
  // window (see "Acceptance" above).
  uint64_t seen_drafted = 0;
  uint64_t seen_accepted = 0;
  double recent_drafted = 0;
  double recent_accepted = 0;
};

struct SpecGateInputs {
  // The request asked for speculation and the worker's model has a draft
  // (MTP) head; otherwise the answer is BATCHED.
  bool speculation_requested = true;
  bool draft_available = true;
  // Session-lifetime telemetry (the gate keeps its recent window in state).
  uint64_t drafted = 0;
  uint64_t accepted = 0;
  // Draft depth the session runs with (>= 1).
  uint32_t k = 1;
  // WorkerInfo.costs: decode_seconds_by_batch[b-1], verify_seconds_by_columns
  // [c-1]. Empty = not measured yet.
  absl::Span<const double> decode_seconds_by_batch;
  absl::Span<const double> verify_seconds_by_columns;
  // Sessions decoding on the worker, this one included (>= 1).
  uint32_t batch_size = 1;
  // UNSPECIFIED for a session's first decision.
  specserve::v1::DecodeMode current_mode =
      specserve::v1::DECODE_MODE_UNSPECIFIED;
  SpecGateState state;
};

struct SpecGateDecision {
  specserve::v1::DecodeMode mode = specserve::v1::BATCHED;
  // The inputs as the gate read them (proto GateDecision fields).
  double measured_acceptance = 0;        // r^
  double expected_tokens_per_round = 0;  // E = 1 + r^·k
  double verify_cost_ratio = 0;          // b·V(k+1) / D(b); 0 = unknown
  uint32_t batch_size = 0;
  std::string reason;
  // Store on the session for the next evaluation (whatever the mode).
  SpecGateState next_state;

  specserve::v1::GateDecision ToProto() const;
};

SpecGateDecision DecideSpec(const SpecGateInputs& in,
                            const SpecGateConfig& config = {});

// The draft depth in 1..max_k that maximizes a speculative session's tokens
// per second at batch b, from its measured per-position acceptance:
// q_j = accepted_per_position[j-1] / drafted_per_position[j-1] is the share
// of rounds drafting position j that accepted drafts 1..j, so a round of
// depth k yields E(k) = 1 + q_1 + ... + q_k tokens, and costs a round alone
// scaled to its group, V(k+1)·D(b·(k+1)) / D(k+1) (the gate's pricing).
// Returns max_k while any position up to max_k has fewer than
// `min_rounds` drafted rounds or the costs are missing: depths are only
// compared on evidence (a position never drafted has none). The tokens of a
// session do not depend on k (§3), only its speed.
uint32_t ChooseKByPosition(absl::Span<const uint64_t> drafted_per_position,
                           absl::Span<const uint64_t> accepted_per_position,
                           uint32_t max_k, uint32_t batch,
                           absl::Span<const double> decode_seconds_by_batch,
                           absl::Span<const double> verify_seconds_by_columns,
                           uint64_t min_rounds = 32);

// Helpers of the model, exposed for tests.
// Smoothed acceptance r^.
double SmoothedAcceptance(double drafted, double accepted,
                          const SpecGateConfig& config);
// The upper Wilson score bound of the rate accepted / drafted at z (1 when
// nothing was drafted).
double AcceptanceUpperBound(double drafted, double accepted, double z);
// Seconds of a round of k drafts in a group at batch b: a round alone,
// V(k+1), scaled as the trunk pass scales from k+1 rows to b·(k+1). 0 when a
// table is empty.
double GroupRoundSeconds(absl::Span<const double> decode_seconds_by_batch,
                         absl::Span<const double> verify_seconds_by_columns,
                         uint32_t k, uint32_t batch);
// Table lookups with extrapolation past the end (index = batch or columns,
// from 1). Return 0 for an empty table.
double DecodeSeconds(absl::Span<const double> by_batch, uint32_t batch);
double VerifySeconds(absl::Span<const double> by_columns, uint32_t columns);

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_SPEC_GATE_H_
