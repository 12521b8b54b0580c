#include "scheduler/placement.h"

#include <algorithm>

#include "absl/status/status.h"

namespace specserve::scheduler {
namespace {

namespace v1 = specserve::v1;

bool IsResident(v1::Residency r) {
  return r == v1::ACTIVE || r == v1::PARKED || r == v1::OFFLOADED;
}

// True when a ranks before b.
bool Better(const WorkerLoad& a, int ia, const WorkerLoad& b, int ib,
            const PlacementOptions& options) {
  const double sa = LoadScore(a, options);
  const double sb = LoadScore(b, options);
  if (sa != sb) return sa < sb;
  if (a.sessions != b.sessions) return a.sessions < b.sessions;
  return ia < ib;
}

// A full worker would evict parked sessions to take one more.
bool IsFull(const WorkerLoad& w, const PlacementOptions& options) {
  return EstimatedMemoryFraction(w) >= options.full_fraction ||
         !FitsAnotherSession(w);
}

// Whether a hit of `cached_tokens` on `holder` is worth its load above
// `least`'s (the rules in placement.h). Scores within rounding of the
// allowance count as within it.
bool PrefixOutweighsImbalance(const WorkerLoad& holder, uint32_t cached_tokens,
                              const WorkerLoad& least,
                              const PlacementOptions& options) {
  constexpr double kRounding = 1e-9;
  const double holder_score = LoadScore(holder, options);
  const double least_score = LoadScore(least, options);
  double worth_sessions = options.prefix_balance_sessions;
  if (options.prefix_tokens_per_session > 0) {
    worth_sessions += cached_tokens / options.prefix_tokens_per_session;
  }
  return holder_score - least_score <=
             options.session_weight * worth_sessions + kRounding ||
         holder_score <= options.prefix_balance_ratio * least_score + kRounding;
}

}  // namespace

WorkerLoad WorkerLoad::FromInfo(bool available,
                                const specserve::worker::v1::WorkerInfo& info) {
  WorkerLoad w;
  w.available = available;
  w.memory_budget_bytes = info.memory_budget_bytes();
  w.memory_used_bytes = info.memory_used_bytes();
  w.active_bursts = info.active_bursts();
  w.sessions = info.sessions();
  return w;
}

double EstimatedMemoryFraction(const WorkerLoad& w) {
  if (w.memory_budget_bytes == 0) return 0;
  const double budget = static_cast<double>(w.memory_budget_bytes);
  const double polled = static_cast<double>(w.memory_used_bytes) / budget;
  if (w.sessions == 0) return polled;
  const double per_session =
      static_cast<double>(w.memory_used_bytes) / w.sessions;
  return std::max(polled, w.placed_sessions * per_session / budget);
}

bool FitsAnotherSession(const WorkerLoad& w) {
  if (w.memory_budget_bytes == 0 || w.sessions == 0) return true;
  const double per_session =
      static_cast<double>(w.memory_used_bytes) / w.sessions;
  const double placed = std::max<double>(w.placed_sessions, w.sessions);
  return (placed + 1) * per_session <=
         static_cast<double>(w.memory_budget_bytes);
}

double LoadScore(const WorkerLoad& w, const PlacementOptions& options) {
  return EstimatedMemoryFraction(w) + options.burst_weight * w.active_bursts +
         options.session_weight * w.placed_sessions;
}

absl::StatusOr<Placement> PlaceSession(v1::Residency residency,
                                       int current_worker,
                                       absl::Span<const WorkerLoad> workers,
                                       const PlacementOptions& options) {
  if (residency == v1::CLOSED) {
    return absl::FailedPreconditionError("a closed session cannot be placed");
  }
  const int n = static_cast<int>(workers.size());
  if (IsResident(residency) && current_worker >= 0 && current_worker < n &&
      workers[current_worker].available) {
    return Placement{current_worker, /*rebuild=*/false};
  }
  // Best non-full worker; failing that, best available one (a full worker
  // can still evict parked sessions to make room).
  int best = -1;
  int best_full = -1;
  for (int i = 0; i < n; ++i) {
    const WorkerLoad& w = workers[i];
    if (!w.available) continue;
    const bool full = IsFull(w, options);
    int& slot = full ? best_full : best;
    if (slot < 0 || Better(w, i, workers[slot], slot, options)) slot = i;
  }
  if (best < 0) best = best_full;
  if (best < 0) return absl::UnavailableError("no worker available");
  return Placement{best, /*rebuild=*/true};
}

absl::StatusOr<PrefixPlacement> PlaceNewSession(
    absl::Span<const WorkerLoad> workers,
    absl::Span<const uint32_t> cached_tokens, const PlacementOptions& options) {
  if (cached_tokens.size() != workers.size()) {
    return absl::InvalidArgumentError(
        "cached_tokens must have one entry per worker");
  }
  absl::StatusOr<Placement> least =
      PlaceSession(v1::NEW, /*current_worker=*/-1, workers, options);
  if (!least.ok()) return least.status();
  const int m = least->worker;
  // Where every worker is full, a full holder is no worse a choice.
  const bool all_full = IsFull(workers[m], options);
  int best = m;
  for (int i = 0; i < static_cast<int>(workers.size()); ++i) {
    const WorkerLoad& w = workers[i];
    if (i == m || !w.available || cached_tokens[i] == 0) continue;
    if (!all_full && IsFull(w, options)) continue;
    if (!PrefixOutweighsImbalance(w, cached_tokens[i], workers[m], options)) {
      continue;
    }
    if (cached_tokens[i] > cached_tokens[best] ||
        (cached_tokens[i] == cached_tokens[best] &&
         Better(w, i, workers[best], best, options))) {
      best = i;
    }
  }
  return PrefixPlacement{best, cached_tokens[best]};
}

}  // namespace specserve::scheduler
