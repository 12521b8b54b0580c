// Session-lifetime acceptance telemetry of speculative rounds, the one type
// both processes keep: the worker counts rounds as it runs them (host-side
// adds, no syncs), the scheduler sums the per-burst deltas it is sent. A
// resumed session carries earlier requests' counts: per-request figures are
// DeltaSince() a snapshot taken before the request's bursts.
#ifndef SPECSERVE_TELEMETRY_SPEC_TELEMETRY_H_
#define SPECSERVE_TELEMETRY_SPEC_TELEMETRY_H_

#include <cstdint>
#include <vector>

#include "proto/specserve.pb.h"

namespace specserve::telemetry {

struct SpecTelemetry {
  uint64_t rounds = 0;
  uint64_t drafted = 0;
  uint64_t accepted = 0;
  // Index i = draft position i+1; grown on demand to the largest k seen.
  std::vector<uint64_t> drafted_per_position;
  std::vector<uint64_t> accepted_per_position;

  // Accounts one round that drafted k tokens and accepted n of them.
  void RecordRound(int k, int n) {
    if (static_cast<int>(drafted_per_position.size()) < k) {
      drafted_per_position.resize(k, 0);
      accepted_per_position.resize(k, 0);
    }
    ++rounds;
    drafted += k;
    accepted += n;
    for (int i = 0; i < k; ++i) ++drafted_per_position[i];
    for (int i = 0; i < n; ++i) ++accepted_per_position[i];
  }

  // This minus an earlier snapshot of the same session.
  SpecTelemetry DeltaSince(const SpecTelemetry& before) const {
    SpecTelemetry d = *this;
    d.rounds -= before.rounds;
    d.drafted -= before.drafted;
    d.accepted -= before.accepted;
    for (size_t i = 0; i < before.drafted_per_position.size(); ++i) {
      d.drafted_per_position[i] -= before.drafted_per_position[i];
      d.accepted_per_position[i] -= before.accepted_per_position[i];
    }
    return d;
  }

  // Adds a delta received over the API (BurstSummary.telemetry_delta).
  void Add(const specserve::v1::SessionTelemetry& delta);
  specserve::v1::SessionTelemetry ToProto() const;

  // Mean tokens emitted per round (accepted drafts + the bonus).
  double MeanTokensPerRound() const {
    return rounds == 0 ? 0.0 : 1.0 + static_cast<double>(accepted) / rounds;
  }
};

}  // namespace specserve::telemetry

#endif  // SPECSERVE_TELEMETRY_SPEC_TELEMETRY_H_
