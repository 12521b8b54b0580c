// The accept step of one speculative round: given k drafted tokens and the
// trunk's verify over k+1 columns, how many drafts are accepted and which
// token is the bonus. The greedy form, and the counters of the sampled one.
//
// Column j of the verify holds the trunk's prediction for the token after
// [committed..., d_1..d_j]; draft d_{i} (1-based) is checked against column
// i-1. The emitted tokens of a round are d_1..d_n followed by the bonus.
#ifndef SPECSERVE_WORKER_SPEC_SPEC_ACCEPT_H_
#define SPECSERVE_WORKER_SPEC_SPEC_ACCEPT_H_

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace specserve::spec {

struct RoundOutcome {
  int accepted = 0;  // n: drafts accepted, 0..k
  int bonus = 0;     // the token after d_n
};

// The Philox event counters a session persists (docs/DESIGN.md §1).
struct RandomCounters {
  uint32_t sctr = 0;  // sampling events
  uint32_t uctr = 0;  // acceptance uniforms
};

// Greedy: n = longest prefix with d_i == target_argmax[i-1];
// bonus = target_argmax[n]. target_argmax has k+1 entries.
RoundOutcome AcceptGreedy(absl::Span<const int> drafts,
                          absl::Span<const int> target_argmax);

// One sampling event, wherever its draw runs (host, backend): `draw` gets
// the event's uniform (Philox stream kSample at sctr), and sctr moves only
// once the draw has succeeded.
absl::StatusOr<int32_t> SampleEvent(uint64_t seed, RandomCounters* counters,
                                    absl::FunctionRef<absl::StatusOr<int32_t>(float u)> draw);

// A sampling event drawn from `probs` on the host.
int DrawToken(const std::vector<float>& probs, uint64_t seed,
              RandomCounters* counters);

// Sampled rounds run their accept step on the backend (kernels/sample_rows.h
// AcceptRound: accept d_i when u·q(d_i) < p(d_i), one uctr per test; on the
// first rejection draw the bonus from normalize(max(0, p − q)), after a full
// accept from p_k, one sctr either way; the output is distributed as plain
// sampling from p). These are the session's counters after a round that
// accepted n of k drafts: uctr moves by the tests made (n + 1 after a
// rejection, k after a full accept), sctr by one.
void AdvanceSampledCounters(int k, int n, RandomCounters* counters);

}  // namespace specserve::spec

#endif  // SPECSERVE_WORKER_SPEC_SPEC_ACCEPT_H_
