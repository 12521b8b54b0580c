#include "worker/step_costs.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "telemetry/status_macros.h"

namespace specserve::worker {
namespace {

// A scratch session primed with a short prompt (costs at short contexts).
absl::StatusOr<std::unique_ptr<model::ModelState>> Scratch(model::Model* m) {
  model::StateOptions o;
  o.capacity = 64;
  SS_ASSIGN_OR_RETURN(auto state, m->NewState(o));
  std::vector<int32_t> prompt(8);
  for (int i = 0; i < 8; ++i) prompt[i] = (i * 7919) % m->config().vocab_size;
  model::ForwardResult r;
  SS_RETURN_IF_ERROR(m->Prefill(state.get(), prompt, {}, &r));
  return state;
}

}  // namespace

absl::StatusOr<specserve::worker::v1::StepCosts> MeasureStepCosts(
    model::Model* model, int max_batch, int max_columns, int reps) {
  specserve::worker::v1::StepCosts costs;
  std::vector<std::unique_ptr<model::ModelState>> states;
  for (int b = 0; b < max_batch; ++b) {
    SS_ASSIGN_OR_RETURN(auto s, Scratch(model));
    states.push_back(std::move(s));
  }
  for (int b = 1; b <= max_batch; ++b) {
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      std::vector<model::ModelState*> batch;
      std::vector<int32_t> tokens;
      for (int i = 0; i < b; ++i) {
        if (states[i]->length() + 1 > states[i]->capacity()) {
          SS_RETURN_IF_ERROR(model->Reset(states[i].get()));
        }
        batch.push_back(states[i].get());
        tokens.push_back(1);
      }
      model::ForwardResult out;
      const absl::Time t0 = absl::Now();
      SS_RETURN_IF_ERROR(model->DecodeBatch(batch, tokens, &out));
      best = std::min(best, absl::ToDoubleSeconds(absl::Now() - t0));
    }
    costs.add_decode_seconds_by_batch(best);
  }
  model::ModelState* s = states[0].get();
  for (int c = 1; c <= max_columns; ++c) {
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      if (s->length() + c > s->capacity()) {
        SS_RETURN_IF_ERROR(model->Reset(s));
        model::ForwardResult p;
        SS_RETURN_IF_ERROR(
            model->Prefill(s, std::vector<int32_t>{1, 2}, {}, &p));
      }
      std::vector<int32_t> cols(c, 1);
      model::ForwardResult out;
      const absl::Time t0 = absl::Now();
      SS_RETURN_IF_ERROR(model->Verify(s, cols, &out));
      best = std::min(best, absl::ToDoubleSeconds(absl::Now() - t0));
      model->DiscardVerified(s);
    }
    costs.add_verify_seconds_by_columns(best);
  }
  return costs;
}

absl::StatusOr<specserve::worker::v1::StepCosts> ParseStepCosts(
    const std::string& spec) {
  specserve::worker::v1::StepCosts costs;
  for (absl::string_view part : absl::StrSplit(spec, ';', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(part, absl::MaxSplits('=', 1));
    for (absl::string_view v :
         absl::StrSplit(kv.second, ',', absl::SkipEmpty())) {
      double x;
      if (!absl::SimpleAtod(v, &x) || x <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--step_costs: bad number '", v, "'"));
      }
      if (kv.first == "decode") {
        costs.add_decode_seconds_by_batch(x);
      } else if (kv.first == "verify") {
        costs.add_verify_seconds_by_columns(x);
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            "--step_costs: expected decode=... or verify=..., got '", part,
            "'"));
      }
    }
  }
  if (costs.decode_seconds_by_batch_size() == 0 ||
      costs.verify_seconds_by_columns_size() == 0) {
    return absl::InvalidArgumentError(
        "--step_costs needs both decode=... and verify=...");
  }
  return costs;
}

}  // namespace specserve::worker
