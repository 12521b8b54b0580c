// What a plain decode step and a speculative round cost on this worker as it
// serves, for the scheduler's spec gate (docs/DESIGN.md §4): the model
// executor records every batched decode pass by its batch size and the spec
// engine every whole round (k draft steps, the k+1-column verify and the MTP
// fill) by its column count k+1. Each entry is an exponential moving average
// of what was measured, so the table follows the contexts and batch
// compositions actually served instead of the start-up probe's short
// scratch sessions.
//
// A table row the loop has not run yet comes from the start-up table (decode
// at batch b, verify at c columns), scaled by how the measured rows compare
// with the start-up ones (the geometric mean of live / start-up over the
// measured rows): every entry then has the same meaning, so the gate can
// compare draft depths and batch sizes across measured and unmeasured rows.
// Rows past the end of the start-up table are extrapolated linearly from its
// last two entries before scaling.
//
// Thread-safe.
#ifndef SPECSERVE_WORKER_SPEC_LIVE_STEP_COSTS_H_
#define SPECSERVE_WORKER_SPEC_LIVE_STEP_COSTS_H_

#include <cstdint>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace specserve::spec {

class LiveStepCosts {
 public:
  // weight: how much one new measurement moves an entry, in (0, 1].
  LiveStepCosts(std::vector<double> startup_decode_by_batch,
                std::vector<double> startup_verify_by_columns,
                double weight = 0.25);

  // A decode pass over `batch` sessions (>= 1) took `seconds`.
  void RecordDecode(int batch, double seconds);
  // A speculative round of `columns` - 1 drafts (columns >= 2) took
  // `seconds`, in a group of rounds whose verify carried `group_rows` rows
  // in all (columns when it ran alone). Kept as the cost of the round alone:
  // `seconds` x decode(columns) / decode(group_rows), the decode table's
  // ratio between the two row counts.
  void RecordRound(int columns, int group_rows, double seconds);

  struct Table {
    // Index i: batch size (or column count) i + 1.
    std::vector<double> decode_seconds_by_batch;
    std::vector<double> round_seconds_by_columns;
  };
  // The current table: as long as the start-up table or the largest row
  // measured, whichever is longer.
  Table Snapshot() const;

 private:
  struct Column {
    std::vector<double> startup;
    std::vector<double> live;  // 0 = not measured yet
  };
  static void Record(Column* c, int index, double seconds, double weight);
  static std::vector<double> Fill(const Column& c);

  const double weight_;
  mutable absl::Mutex mu_;
  Column decode_ ABSL_GUARDED_BY(mu_);
  Column round_ ABSL_GUARDED_BY(mu_);
};

}  // namespace specserve::spec

#endif  // SPECSERVE_WORKER_SPEC_LIVE_STEP_COSTS_H_
