// Speculative rounds of many sessions as one group (SpecEngine::Round): the
// rounds queued while the model was busy run together with the model held,
// as k shared MTP draft passes (the first also writes the MTP rows each
// session owes), one shared verify and each session's accept. Every shared
// pass is row-invariant (Model::MtpBatch, Model::VerifyBatch, SampleRows),
// so a session's tokens do not depend on who it ran with, and the group
// costs about k + 1 passes however many sessions it holds: one round per
// session costs what a round alone does.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "telemetry/status_macros.h"
#include "worker/spec/spec_accept.h"
#include "worker/spec/spec_engine.h"

namespace specserve::spec {

struct SpecEngine::RoundTask : ModelExecutor::GroupTask {
  SpecSession* s = nullptr;
  const BurstCtx* b = nullptr;
  int k = 0;
  std::vector<int32_t>* emitted = nullptr;
  std::vector<TokenLogprobs>* logprobs = nullptr;

  // The round's working state. L: the committed length at the round's
  // start; the chain's next input (h, tok) at MTP row L - 1 + drafts.size().
  int L = 0;
  std::vector<float> h;
  int32_t tok = -1;
  std::vector<int32_t> drafts;
  std::vector<int32_t> columns;  // [pending, drafts...]
  model::ForwardResult v;        // the verify
  int group_rows = 0;            // verify rows of the group it ran in
  // Sampled or adjusted: each column's chosen token.
  std::vector<int32_t> target;

  bool greedy() const { return b->params.sampling.greedy(); }
  // Whether the controls follow its tokens (logit controls or a grammar):
  // drafts and targets alike, each at its own position.
  bool tracked() const { return b->adjusted(); }
  // Whether its rows are picked on the host (BurstCtx::on_host).
  bool on_host() const { return b->on_host(); }
  // Whether its rows carry the grammar's mask to the backend.
  bool masked() const { return b->masked_on_backend(); }
  // The device's pick of the verify columns (argmax) is the target.
  bool device_argmax() const { return greedy() && !on_host(); }
  void Start() {
    status = absl::OkStatus();
    L = s->committed_len();
    h = s->last_hidden();
    tok = *s->pending_tok;
    drafts.clear();
    columns.clear();
    target.clear();
    v = model::ForwardResult();
    v.want_logits = b->params.logprobs.has_value() || on_host();
    // The history up to the pending token (drafts of a refused try gone).
    if (tracked()) b->controls->PopTo(L + 1);
  }
};

absl::Status SpecEngine::Round(SpecSession* s, const BurstCtx& b, int k,
                               std::vector<int32_t>* emitted,
                               std::vector<TokenLogprobs>* logprobs) {
  RoundTask t;
  t.s = s;
  t.b = &b;
  t.k = k;
  t.emitted = emitted;
  t.logprobs = logprobs;
  t.rows = k + 1;
  // Timed as a whole, waits for the model included: what the round cost
  // this session as served, recorded with its group's rows.
  const absl::Time t0 = absl::Now();
  executor_->Together(&t, round_runner_);
  if (LiveStepCosts* costs = executor_->live_costs(); t.status.ok() && costs) {
    costs->RecordRound(k + 1, t.group_rows,
                       absl::ToDoubleSeconds(absl::Now() - t0));
  }
  return t.status;
}

void SpecEngine::RunRounds(absl::Span<ModelExecutor::GroupTask* const> group) {
  std::vector<RoundTask*> tasks;
  for (ModelExecutor::GroupTask* g : group) {
    tasks.push_back(static_cast<RoundTask*>(g));
  }
  int rows = 0;
  for (RoundTask* t : tasks) rows += t->rows;
  for (RoundTask* t : tasks) {
    t->Start();
    t->group_rows = rows;
  }
  const absl::Status shared = RoundsLocked(tasks);
  if (shared.ok()) return;
  if (tasks.size() == 1) {
    tasks[0]->status = shared;
    return;
  }
  // A shared pass was refused before it ran (one session's bad input must
  // not fail the others): every round again alone. What the group already
  // ran is redone bit for bit (the same rows at the same positions), and no
  // task was accepted yet: accepts run after the last shared pass.
  for (RoundTask* t : tasks) {
    if (t->s->caches()->verified_columns() != 0) {
      model_->DiscardVerified(t->s->caches());
    }
    t->Start();
    t->group_rows = t->rows;
    RoundTask* const one[] = {t};
    const absl::Status alone = RoundsLocked(one);
    if (!alone.ok()) t->status = alone;
  }
}

absl::Status SpecEngine::DraftStepLocked(absl::Span<RoundTask* const> tasks,
                                         int step) {
  // Owed rows beyond what one pass holds go first on their own.
  if (step == 0) {
    for (RoundTask* t : tasks) {
      if (static_cast<int>(t->s->deferred_mtp().tokens.size()) + 1 >
          model::Model::kMaxRows) {
        SS_RETURN_IF_ERROR(FlushMtpLocked(t->s));
      }
    }
  }
  for (size_t first = 0; first < tasks.size();) {
    // The sessions of this pass, their rows and the inputs behind them.
    std::vector<RoundTask*> in;
    std::vector<model::ModelState*> states;
    std::vector<std::vector<float>> hiddens;
    std::vector<std::vector<int32_t>> tokens;
    std::vector<int> first_rows;
    int rows = 0;
    size_t i = first;
    for (; i < tasks.size(); ++i) {
      RoundTask* t = tasks[i];
      if (!t->status.ok()) continue;  // a dead end below
      const DeferredMtp* owed = step == 0 && !t->s->deferred_mtp().empty()
                                    ? &t->s->deferred_mtp()
                                    : nullptr;
      const int n = 1 + (owed ? static_cast<int>(owed->tokens.size()) : 0);
      if (!in.empty() && rows + n > model::Model::kMaxRows) break;
      rows += n;
      in.push_back(t);
      states.push_back(t->s->caches());
      std::vector<float> hid;
      std::vector<int32_t> tok;
      // The chain's row: (h, tok) at MTP row L - 1 + step, after the owed
      // rows, which end right before it (SpecSession's invariant).
      const int row = t->L - 1 + step;
      if (owed != nullptr) {
        CHECK_EQ(owed->end_row(), row)
            << "session " << t->s->id() << ": owed MTP rows end elsewhere";
        hid = owed->hiddens;
        tok = owed->tokens;
      }
      hid.insert(hid.end(), t->h.begin(), t->h.end());
      tok.push_back(t->tok);
      first_rows.push_back(row + 1 - static_cast<int>(tok.size()));
      hiddens.push_back(std::move(hid));
      tokens.push_back(std::move(tok));
    }
    first = i;
    std::vector<model::Model::MtpRows> mtp_rows;
    std::vector<model::ForwardResult> out(in.size());
    std::vector<model::ForwardResult*> outs;
    for (size_t j = 0; j < in.size(); ++j) {
      mtp_rows.push_back({first_rows[j], hiddens[j], tokens[j]});
      out[j].want_logits = in[j]->on_host();
      outs.push_back(&out[j]);
      // Draft d_{step+1}, the token at index L + 1 + step, under the
      // grammar's mask there. A dead end fails the session as a plain
      // step's would (the host path does the same after the pass).
      RoundTask* t = in[j];
      if (t->masked()) {
        t->status = RequestMask(*t->s, *t->b, t->L + 1 + step, 0, &out[j]);
      }
    }
    if (in.size() == 1 && tokens[0].size() == 1) {
      // Alone: MtpDraft, which replays a recorded step where the backend
      // can.
      SS_RETURN_IF_ERROR(model_->MtpDraft(states[0], hiddens[0], tokens[0][0],
                                          first_rows[0], &out[0]));
    } else {
      SS_RETURN_IF_ERROR(model_->MtpBatch(states, mtp_rows, outs));
    }
    if (step == 0) {
      for (RoundTask* t : in) t->s->deferred_mtp() = DeferredMtp{};
    }
    // Sampled drafts: draft d_{step+1} is the token at index L + 1 + step,
    // drawn from the head's distribution at that position's uniform
    // (spec_accept.h), all of this pass's in one call over its logits.
    std::vector<int32_t> which;
    std::vector<sampling::SamplingConfig> configs;
    std::vector<float> uniforms;
    for (size_t j = 0; j < in.size(); ++j) {
      const RoundTask* t = in[j];
      if (!t->status.ok() || t->greedy() || t->on_host() ||
          !out[j].AllFinite()) {
        continue;
      }
      which.push_back(static_cast<int32_t>(j));
      configs.push_back(t->b->params.sampling);
      uniforms.push_back(PositionUniform(t->b->params.seed, t->L + 1 + step));
    }
    std::vector<int32_t> drawn;
    if (!which.empty()) {
      SS_RETURN_IF_ERROR(model_->SampleRows(which, configs, uniforms, &drawn));
    }
    size_t next_drawn = 0;
    for (size_t j = 0; j < in.size(); ++j) {
      RoundTask* t = in[j];
      if (!t->status.ok()) continue;
      if (!out[j].AllFinite()) {
        t->status = NonFinite(t->s->id());
        continue;
      }
      if (t->on_host()) {
        // Adjusted as the trunk's row for the same position will be, which
        // keeps the drafts likely to be accepted.
        absl::StatusOr<int32_t> d =
            ChooseAdjusted(*t->s, *t->b, out[j].logits.data(), t->L + 1 + step);
        if (!d.ok()) {
          t->status = d.status();
          continue;
        }
        t->tok = *d;
        t->b->controls->Push(t->tok);
      } else {
        t->tok = t->greedy() ? out[j].argmax[0] : drawn[next_drawn++];
        if (t->tracked()) t->b->controls->Push(t->tok);
      }
      t->drafts.push_back(t->tok);
      t->h = std::move(out[j].hidden);
    }
  }
  return absl::OkStatus();
}

absl::Status SpecEngine::RoundsLocked(absl::Span<RoundTask* const> tasks) {
  int max_k = 0;
  for (const RoundTask* t : tasks) max_k = std::max(max_k, t->k);
  auto running = [&](int step) {
    std::vector<RoundTask*> r;
    for (RoundTask* t : tasks) {
      if (t->status.ok() && t->k > step) r.push_back(t);
    }
    return r;
  };
  // Where a group's time goes (GLOG_v=1): the draft passes, the verify, the
  // accepts.
  const absl::Time t0 = absl::Now();
  for (int step = 0; step < max_k; ++step) {
    SS_RETURN_IF_ERROR(DraftStepLocked(running(step), step));
  }
  for (RoundTask* t : tasks) {
    if (t->tracked()) t->b->controls->PopTo(t->L + 1);
  }
  const absl::Time drafted = absl::Now();

  // Verify [x, d_1..d_k] of every session in one trunk pass. No logits
  // come back unless logprobs are asked or the logit controls adjust them:
  // greedy needs the argmax only, and a sampled round draws its targets on
  // the backend from the pass's logits (column j's draw is the token at
  // index L + 1 + j).
  // Column j chooses the token at index L + 1 + j, after the pending token
  // and d_1..d_j: a masked task's columns get the grammar's masks there.
  for (RoundTask* t : running(-1)) {
    if (!t->masked()) continue;
    std::vector<int32_t> cols = {*t->s->pending_tok};
    cols.insert(cols.end(), t->drafts.begin(), t->drafts.end());
    for (size_t j = 0; j < cols.size() && t->status.ok(); ++j) {
      t->status = RequestMask(*t->s, *t->b, t->L + 1 + static_cast<int>(j),
                              static_cast<int>(j), &t->v);
      if (j + 1 < cols.size()) t->b->controls->Push(cols[j + 1]);
    }
    t->b->controls->PopTo(t->L + 1);
  }
  const std::vector<RoundTask*> verifying = running(-1);
  if (verifying.empty()) return absl::OkStatus();
  std::vector<model::ModelState*> states;
  std::vector<std::vector<int32_t>> columns;
  std::vector<model::ForwardResult*> outs;
  for (RoundTask* t : verifying) {
    t->columns = {*t->s->pending_tok};
    t->columns.insert(t->columns.end(), t->drafts.begin(), t->drafts.end());
    states.push_back(t->s->caches());
    columns.push_back(t->columns);
    outs.push_back(&t->v);
  }
  if (verifying.size() == 1) {
    // Alone: Verify, which replays a recorded step where the backend can.
    SS_RETURN_IF_ERROR(model_->Verify(states[0], columns[0], &verifying[0]->v));
  } else {
    SS_RETURN_IF_ERROR(model_->VerifyBatch(states, columns, outs));
  }
  // Non-finite columns (or injected faults) fail their session only; the
  // healthy sampled sessions draw their targets in one call.
  std::vector<int32_t> which;
  std::vector<sampling::SamplingConfig> configs;
  std::vector<float> uniforms;
  std::vector<RoundTask*> drawing;
  int row0 = 0;
  for (RoundTask* t : verifying) {
    ++trunk_passes_;
    const int cols = static_cast<int>(t->columns.size());
    if (t->b->Injects(cols) || !t->v.AllFinite()) {
      t->status = NonFinite(t->s->id());
    } else if (t->on_host()) {
      t->status = AdjustedTargetsLocked(t);
    } else if (!t->greedy()) {
      drawing.push_back(t);
      for (int j = 0; j < cols; ++j) {
        which.push_back(row0 + j);
        configs.push_back(t->b->params.sampling);
        uniforms.push_back(PositionUniform(t->b->params.seed, t->L + 1 + j));
      }
    }
    row0 += cols;
  }
  if (!which.empty()) {
    std::vector<int32_t> drawn;
    const absl::Status sampled =
        model_->SampleRows(which, configs, uniforms, &drawn);
    size_t next = 0;
    for (RoundTask* t : drawing) {
      const size_t cols = t->columns.size();
      if (sampled.ok()) {
        t->target.assign(drawn.begin() + next, drawn.begin() + next + cols);
      } else {
        t->status = sampled;
      }
      next += cols;
    }
  }
  const absl::Time verified = absl::Now();
  for (RoundTask* t : verifying) {
    if (!t->status.ok()) {
      model_->DiscardVerified(t->s->caches());
      continue;
    }
    t->status = AcceptLocked(t);
  }
  VLOG(1) << "round group: " << tasks.size() << " sessions, " << row0
          << " verify rows: drafts " << absl::FormatDuration(drafted - t0)
          << " (" << max_k << " steps), verify "
          << absl::FormatDuration(verified - drafted) << ", accepts "
          << absl::FormatDuration(absl::Now() - verified);
  return absl::OkStatus();
}

absl::Status SpecEngine::AdjustedTargetsLocked(RoundTask* t) {
  // Column j chooses the token at index L + 1 + j, after the pending token
  // and drafts d_1..d_j: the penalties of exactly that prefix, as a plain
  // step there would apply them.
  const int V = model_->config().vocab_size;
  const int cols = static_cast<int>(t->columns.size());
  absl::Status status;
  for (int j = 0; j < cols && status.ok(); ++j) {
    absl::StatusOr<int32_t> target = ChooseAdjusted(
        *t->s, *t->b, t->v.logits.data() + static_cast<size_t>(j) * V,
        t->L + 1 + j);
    if (!target.ok()) {
      status = target.status();
      break;
    }
    t->target.push_back(*target);
    if (j + 1 < cols) t->b->controls->Push(t->columns[j + 1]);
  }
  t->b->controls->PopTo(t->L + 1);
  return status;
}

absl::Status SpecEngine::AcceptLocked(RoundTask* t) {
  SpecSession* s = t->s;
  const BurstParams& p = t->b->params;
  const std::vector<int32_t>& columns = t->columns;
  const model::ForwardResult& v = t->v;
  const RoundOutcome out =
      AcceptRound(t->drafts, t->device_argmax() ? v.argmax : t->target);
  const int H = model_->config().hidden_size;
  const int L = s->committed_len();
  const int k = static_cast<int>(columns.size()) - 1;
  const int n = out.accepted;
  SS_RETURN_IF_ERROR(model_->CommitVerified(s->caches(), n));

  // MTP rows L .. L+n−1 were written by the chain from its own hiddens;
  // they are owed again from the verify's true hiddens (row L−1 was already
  // true) and written with the next round's first draft step.
  SS_RETURN_IF_ERROR(model_->TruncateMtp(s->caches(), L));
  if (n > 0) {
    DeferredMtp& d = s->deferred_mtp();
    CHECK(d.empty()) << "session " << s->id() << ": owed rows before accept";
    d.first_row = L;
    d.hiddens.assign(v.hidden.begin(),
                     v.hidden.begin() + static_cast<size_t>(n) * H);
    d.tokens.assign(columns.begin() + 1, columns.begin() + 1 + n);
  }

  s->committed.insert(s->committed.end(), columns.begin(),
                      columns.begin() + n + 1);
  s->last_hidden().assign(v.hidden.begin() + static_cast<size_t>(n) * H,
                          v.hidden.begin() + static_cast<size_t>(n + 1) * H);
  // The bonus token stays pending, so last_logits (read only when nothing
  // is pending) is not needed: the next Flush sets it.
  s->last_logits().clear();
  s->pending_tok = out.bonus;
  s->telem.RecordRound(k, n);
  t->emitted->assign(columns.begin() + 1, columns.begin() + 1 + n);
  t->emitted->push_back(out.bonus);
  if (p.logprobs) {
    // Emitted token j was chosen from column j, whose logits are those
    // plain decode has at that position, bit for bit.
    const int V = model_->config().vocab_size;
    for (int j = 0; j <= n; ++j) {
      t->logprobs->push_back(
          LogprobsOf(p, v.logits.data() + static_cast<size_t>(j) * V, V,
                     (*t->emitted)[j]));
    }
  }
  return absl::OkStatus();
}

}  // namespace specserve::spec
