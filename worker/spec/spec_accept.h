// The accept step of one speculative round: given k drafted tokens and the
// trunk's target token at each of the k+1 verify columns, how many drafts are
// accepted and which token is the bonus. One rule serves greedy and sampled
// decoding; they differ only in how a column's target token is chosen.
//
// Column j of the verify holds the trunk's prediction for the token after
// [committed..., d_1..d_j]; draft d_{i} (1-based) is checked against column
// i-1. The emitted tokens of a round are d_1..d_n followed by the bonus.
//
// Sampled decoding keys every draw by the token's position: the token at
// history index `pos` is drawn from the trunk's filtered distribution at the
// uniform PositionUniform(seed, pos), whether a plain step, a verify column or
// the first token of a burst draws it, and a draft for that position is drawn
// from the head's distribution at the same uniform. Accepting a draft only
// where it equals the trunk's own draw makes every emitted token exactly the
// token plain sampling draws there (so its distribution is plain sampling's),
// and the draws depend on nothing but (seed, position, the logits there):
// not on how bursts split, on k, on demotion, or on a rebuild elsewhere.
// Coupling the draft to the same uniform is what makes d == target likely
// when the head's distribution is close to the trunk's.
#ifndef SPECSERVE_WORKER_SPEC_SPEC_ACCEPT_H_
#define SPECSERVE_WORKER_SPEC_SPEC_ACCEPT_H_

#include <cstdint>

#include "absl/types/span.h"

namespace specserve::spec {

struct RoundOutcome {
  int accepted = 0;  // n: drafts accepted, 0..k
  int bonus = 0;     // the token after d_n
};

// n = longest prefix with d_i == target[i-1]; bonus = target[n]. target has
// k+1 entries: each column's argmax (greedy) or draw (sampled).
RoundOutcome AcceptRound(absl::Span<const int> drafts,
                         absl::Span<const int> target);

// The uniform that draws the token at history index `pos` (0-based over the
// session's committed tokens followed by the pending one) for `seed`.
float PositionUniform(uint64_t seed, int64_t pos);

}  // namespace specserve::spec

#endif  // SPECSERVE_WORKER_SPEC_SPEC_ACCEPT_H_
