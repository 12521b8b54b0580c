#include "tools/specgen/spec_runner.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "telemetry/status_macros.h"
#include "worker/spec/model_executor.h"

namespace specserve::tools::specgen {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The turn's reported output: at most max_new tokens, ending at the first
// stop token.
std::vector<int32_t> Reported(const std::vector<int32_t>& emitted, int max_new,
                              const std::vector<int32_t>& stop_ids) {
  std::vector<int32_t> ids;
  for (int32_t t : emitted) {
    if (static_cast<int>(ids.size()) >= max_new) break;
    ids.push_back(t);
    if (std::find(stop_ids.begin(), stop_ids.end(), t) != stop_ids.end()) break;
  }
  return ids;
}

}  // namespace

const char* BurstEndName(spec::BurstEnd end) {
  switch (end) {
    case spec::BurstEnd::kMaxNew:
      return "max_new";
    case spec::BurstEnd::kStopToken:
      return "stop_token";
    case spec::BurstEnd::kCapacity:
      return "capacity";
    case spec::BurstEnd::kCancelled:
      return "cancelled";
  }
  return "?";
}

int AutoCapacity(absl::Span<const Turn> turns, int k) {
  // Every turn's prompt, its tokens, the overshoot of its last round and
  // the carried pending token's row, plus a little room.
  int rows = 8;
  for (const Turn& t : turns)
    rows += static_cast<int>(t.prompt.size()) + t.max_new + k + 2;
  return rows;
}

absl::StatusOr<SpecRun> RunTurns(model::Model* model,
                                 absl::Span<const Turn> turns,
                                 const SpecRunOptions& o) {
  if (turns.empty()) return absl::InvalidArgumentError("no turns to run");
  if (turns[0].prompt.empty())
    return absl::InvalidArgumentError("the first turn needs a prompt");
  if (turns[0].rewind)
    return absl::InvalidArgumentError(
        "the first turn cannot rewind (there is no checkpoint yet)");
  if (o.k > 0 && !model->has_mtp())
    return absl::FailedPreconditionError(
        "--spec-k needs a model with an MTP head; this one has none");
  spec::ModelExecutor executor(model);
  spec::SpecEngine engine(&executor);
  const int capacity = o.capacity > 0 ? o.capacity : AutoCapacity(turns, o.k);

  SpecRun run;
  const auto t_admit = Clock::now();
  SS_ASSIGN_OR_RETURN(std::unique_ptr<spec::SpecSession> s,
                      engine.Admit("specgen", capacity, turns[0].prompt));
  run.prefill_seconds = Since(t_admit);
  run.prefill_tokens = static_cast<int>(turns[0].prompt.size());

  for (size_t i = 0; i < turns.size(); ++i) {
    const Turn& turn = turns[i];
    TurnResult tr;
    const telemetry::SpecTelemetry before = s->telem;
    const auto t_turn = Clock::now();
    // The first turn's prompt went in with Admit; a later turn's prompt (or
    // rewind) rides on its first burst.
    const bool has_input = i > 0 && (!turn.prompt.empty() || turn.rewind);
    int produced = 0;
    while (tr.bursts == 0 ? (has_input || turn.max_new > 0)
                          : produced < turn.max_new) {
      spec::BurstParams p;
      if (tr.bursts == 0 && i > 0) {
        p.suffix = turn.prompt;
        p.rewind = turn.rewind;
      }
      const int remaining = std::max(0, turn.max_new - produced);
      p.max_new = o.burst > 0 ? std::min(o.burst, remaining) : remaining;
      p.k = o.k;
      p.sampling = o.sampling;
      p.seed = o.seed;
      p.stop_ids = o.stop_ids;
      SS_ASSIGN_OR_RETURN(
          spec::BurstResult r,
          engine.RunBurst(s.get(), p, [&](absl::Span<const int32_t> toks) {
            tr.emitted.insert(tr.emitted.end(), toks.begin(), toks.end());
            return true;
          }));
      if (tr.bursts == 0 && i > 0) tr.cached_tokens = r.cached_tokens;
      ++tr.bursts;
      produced += r.produced;
      tr.end = r.end;
      if (r.end != spec::BurstEnd::kMaxNew) break;
    }
    tr.seconds = Since(t_turn);
    tr.telemetry = s->telem.DeltaSince(before);
    tr.ids = Reported(tr.emitted, turn.max_new, o.stop_ids);
    run.turns.push_back(std::move(tr));
  }
  run.telemetry = s->telem;
  return run;
}

absl::StatusOr<std::vector<std::vector<int32_t>>> PlainGreedyTurns(
    model::Model* model, absl::Span<const Turn> turns, const SpecRun& run) {
  std::vector<std::vector<int32_t>> out;
  std::vector<int32_t> history;
  size_t checkpoint = 0;
  for (size_t i = 0; i < turns.size() && i < run.turns.size(); ++i) {
    const Turn& turn = turns[i];
    if (turn.rewind) history.resize(checkpoint);
    if (!turn.prompt.empty()) {
      history.insert(history.end(), turn.prompt.begin(), turn.prompt.end());
      checkpoint = history.size();
    }
    const int n = static_cast<int>(run.turns[i].emitted.size());
    std::vector<int32_t> gen;
    if (n > 0) {
      SS_ASSIGN_OR_RETURN(
          auto state,
          model->NewState(
              {.capacity = static_cast<int>(history.size()) + n + 1}));
      model::ForwardResult r;
      SS_RETURN_IF_ERROR(model->Prefill(state.get(), history, {}, &r));
      int32_t next = r.argmax.back();
      while (true) {
        gen.push_back(next);
        if (static_cast<int>(gen.size()) == n) break;
        SS_RETURN_IF_ERROR(model->Decode(state.get(), next, &r));
        next = r.argmax[0];
      }
    }
    history.insert(history.end(), gen.begin(), gen.end());
    out.push_back(std::move(gen));
  }
  return out;
}

}  // namespace specserve::tools::specgen
