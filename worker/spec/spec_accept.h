// The accept step of one speculative round: given k drafted tokens and the
// trunk's verify over k+1 columns, how many drafts are accepted and which
// token is the bonus. Greedy and sampled (rejection sampling) forms.
//
// Column j of the verify holds the trunk's prediction for the token after
// [committed..., d_1..d_j]; draft d_{i} (1-based) is checked against column
// i-1. The emitted tokens of a round are d_1..d_n followed by the bonus.
#ifndef SPECSERVE_WORKER_SPEC_SPEC_ACCEPT_H_
#define SPECSERVE_WORKER_SPEC_SPEC_ACCEPT_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace specserve::spec {

struct RoundOutcome {
  int accepted = 0;  // n: drafts accepted, 0..k
  int bonus = 0;     // the token after d_n
};

// The Philox event counters a session persists (DESIGN.md §1).
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

// Sampled: p[j] (j = 0..k) are the filtered target distributions of the verify
// columns, q[i] (i = 0..k-1) the filtered draft distributions d_{i+1} was
// drawn from. Accept d_i when u·q(d_i) < p(d_i) (one uctr per test); on the
// first rejection draw the bonus from normalize(max(0, p − q)); after a full
// accept draw it from p[k] (one sctr either way). The output distribution
// equals plain sampling from p.
RoundOutcome AcceptSampled(absl::Span<const int> drafts,
                           const std::vector<std::vector<float>>& p,
                           const std::vector<std::vector<float>>& q,
                           uint64_t seed, RandomCounters* counters);

// The same with the target distributions made on demand: target(j) returns
// p[j], used before the next call. Only columns 0..n are asked for (n =
// accepted), in order, so a round that rejects early filters fewer verify
// columns; the outcome and the counters are those of the form above. A
// target error is returned as is.
using TargetProbs = std::function<absl::StatusOr<const std::vector<float>*>(int column)>;
absl::StatusOr<RoundOutcome> AcceptSampled(absl::Span<const int> drafts,
                                           const TargetProbs& target,
                                           const std::vector<std::vector<float>>& q,
                                           uint64_t seed, RandomCounters* counters);

// The counters after a sampled round that accepted n of k drafts, moved as
// AcceptSampled moves them: one uctr per test made (n + 1 after a
// rejection, k after a full accept) and one sctr for the bonus. The
// engine's rounds run the accept step on the backend
// (kernels/sample_rows.h AcceptRound, whose tests and draws are these) and
// move the counters here.
void AdvanceSampledCounters(int k, int n, RandomCounters* counters);

}  // namespace specserve::spec

#endif  // SPECSERVE_WORKER_SPEC_SPEC_ACCEPT_H_
