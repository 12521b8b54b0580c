#include "worker/spec/model_executor.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "telemetry/status_macros.h"

namespace specserve::spec {
namespace {

// The executor whose LoopMember the current thread holds (at most one).
thread_local const ModelExecutor* member_of = nullptr;

}  // namespace

ModelExecutor::LoopMember::LoopMember(ModelExecutor* executor)
    : executor_(executor) {
  if (member_of != nullptr) return;
  member_of = executor_;
  counted_ = true;
  absl::MutexLock q(&executor_->queue_mu_);
  ++executor_->members_;
}

ModelExecutor::LoopMember::~LoopMember() {
  if (!counted_) return;
  member_of = nullptr;
  absl::MutexLock q(&executor_->queue_mu_);
  --executor_->members_;
}

bool ModelExecutor::CallerIsMember() const { return member_of == this; }

absl::Status ModelExecutor::Exclusive(const std::function<absl::Status()>& fn) {
  ExclusiveStep mine{&fn};
  Combine(
      &exclusives_, &mine, [](const ExclusiveStep&) { return 0; },
      &ModelExecutor::RunExclusives, &stats_.exclusive_holds,
      &stats_.exclusive);
  return mine.status;
}

void ModelExecutor::RunExclusives(const std::vector<ExclusiveStep*>& batch) {
  for (ExclusiveStep* e : batch) e->status = (*e->fn)();
}

template <typename Full>
void ModelExecutor::AwaitMembersLocked(Full full) {
  auto ready = [this, &full]() {
    return blocked_members_ >= members_ || full();
  };
  if (ready()) return;
  // Before any pass has been timed, the bound alone.
  const absl::Duration wait =
      last_pass_ == absl::ZeroDuration()
          ? gather_.max_wait
          : std::min(gather_.max_wait, last_pass_ * gather_.fraction_of_pass);
  if (!queue_mu_.AwaitWithTimeout(absl::Condition(&ready), wait)) {
    ++stats_.gather_timeouts;
  }
}

void ModelExecutor::YieldToStreamingLocked() {
  AwaitMembersLocked([] { return false; });
  const uint64_t decodes = stats_.batches;
  const uint64_t groups = stats_.groups;
  auto served = [&]() {
    return (decodes_.queue.empty() || stats_.batches > decodes) &&
           (groups_.queue.empty() || stats_.groups > groups);
  };
  queue_mu_.Await(absl::Condition(&served));
}

absl::Status ModelExecutor::Interleaved(
    const std::function<absl::Status()>& fn) {
  {
    absl::MutexLock q(&queue_mu_);
    YieldToStreamingLocked();
  }
  return Exclusive(fn);
}

int ModelExecutor::PrefillChunkRows() const {
  absl::MutexLock q(&queue_mu_);
  return members_ > 0 ? kInterleavedPrefillRows : model::Model::kMaxPrefillRows;
}

absl::Status ModelExecutor::Prefill(model::ModelState* state,
                                    absl::Span<const int32_t> tokens,
                                    std::vector<float>* all_hidden,
                                    model::ForwardResult* out) {
  if (tokens.size() > static_cast<size_t>(model::Model::kMaxPrefillRows)) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefill chunk of ", tokens.size(), " tokens (at most ",
                     model::Model::kMaxPrefillRows, ")"));
  }
  {
    absl::MutexLock q(&queue_mu_);
    YieldToStreamingLocked();
  }
  PrefillStep mine{state, tokens, all_hidden, out};
  Combine(
      &prefills_, &mine,
      [](const PrefillStep& p) { return static_cast<int>(p.tokens.size()); },
      &ModelExecutor::RunPrefills, &stats_.prefill_passes,
      &stats_.prefill_chunks);
  return mine.status;
}

void ModelExecutor::RunPrefills(const std::vector<PrefillStep*>& batch) {
  auto alone = [this](PrefillStep* p) {
    model::PrefillOptions options;
    options.all_hidden = p->all_hidden;
    p->status = model_->Prefill(p->state, p->tokens, options, p->out);
  };
  if (batch.size() == 1) {
    alone(batch[0]);
    return;
  }
  std::vector<model::ModelState*> states;
  std::vector<absl::Span<const int32_t>> tokens;
  std::vector<std::vector<float>*> hiddens;
  std::vector<model::ForwardResult*> outs;
  for (PrefillStep* p : batch) {
    states.push_back(p->state);
    tokens.push_back(p->tokens);
    hiddens.push_back(p->all_hidden);
    outs.push_back(p->out);
  }
  const absl::Status status =
      model_->PrefillBatch(states, tokens, hiddens, outs);
  if (!status.ok()) {
    // Checked before anything ran: each alone, with its own status.
    for (PrefillStep* p : batch) alone(p);
    return;
  }
  for (PrefillStep* p : batch) p->status = status;
}

template <typename S, typename RowsOf, typename Run>
void ModelExecutor::Combine(Combiner<S>* c, S* mine, RowsOf rows_of, Run run,
                            uint64_t* passes, uint64_t* carried) {
  absl::MutexLock lock(&queue_mu_);
  mine->member = CallerIsMember();
  if (mine->member) ++blocked_members_;
  c->queue.push_back(mine);
  while (!mine->done) {
    if (c->leader_active) {
      auto cond = [c, mine]() { return mine->done || !c->leader_active; };
      queue_mu_.Await(absl::Condition(&cond));
      continue;
    }
    c->leader_active = true;
    queue_mu_.Unlock();
    std::vector<S*> batch;
    absl::Duration pass;
    const absl::Time asked = absl::Now();
    absl::Time held;
    int rows = 0;
    {
      absl::MutexLock model_lock(&model_mu_);
      held = absl::Now();
      {
        absl::MutexLock q(&queue_mu_);
        if (c->gathers) {
          AwaitMembersLocked([c, &rows_of]() {
            int rows = 0;
            for (const S* s : c->queue) rows += rows_of(*s);
            return rows >= c->max_rows;
          });
        }
        while (!c->queue.empty()) {
          const int n = rows_of(*c->queue.front());
          if (!batch.empty() && rows + n > c->max_rows) break;
          batch.push_back(c->queue.front());
          c->queue.pop_front();
          rows += n;
        }
      }
      const absl::Time t0 = absl::Now();
      (this->*run)(batch);
      pass = absl::Now() - t0;
      // The pass timeline (GLOG_v=2): what ran, for how many, after how
      // long a wait for the model and for the members.
      VLOG(2) << c->name << " pass: " << batch.size() << " steps, " << rows
              << " rows; model after " << absl::FormatDuration(held - asked)
              << ", gathered " << absl::FormatDuration(t0 - held) << ", ran "
              << absl::FormatDuration(pass);
    }
    queue_mu_.Lock();
    for (S* step : batch) {
      step->done = true;
      if (step->member) --blocked_members_;
    }
    if (c->gathers) last_pass_ = pass;
    ++*passes;
    *carried += batch.size();
    c->leader_active = false;
  }
}

absl::Status ModelExecutor::Decode(model::ModelState* state, int32_t token,
                                   model::ForwardResult* out) {
  Step mine{state, token, out};
  Combine(
      &decodes_, &mine, [](const Step&) { return 1; },
      &ModelExecutor::RunDecodes, &stats_.batches, &stats_.steps);
  return mine.status;
}

void ModelExecutor::RunDecodes(const std::vector<Step*>& batch) {
  std::vector<model::ModelState*> states;
  std::vector<int32_t> tokens;
  for (Step* s : batch) {
    states.push_back(s->state);
    tokens.push_back(s->token);
  }
  // Logits stay in the workspace: the rows asked for are copied out
  // one by one below, not the whole [B][V] block.
  model::ForwardResult all;
  all.want_logits = false;
  // Each step's constrained row (its row 0) is row i of the pass.
  for (size_t i = 0; i < batch.size(); ++i) {
    const model::ForwardResult& r = *batch[i]->out;
    if (r.mask_rows.empty()) continue;
    CHECK(r.mask_rows.size() == 1 && r.mask_rows[0] == 0)
        << "a decode step's one row is row 0";
    all.mask_rows.push_back(static_cast<int32_t>(i));
    all.mask_words.insert(all.mask_words.end(), r.mask_words.begin(),
                          r.mask_words.end());
  }
  const absl::Time t0 = absl::Now();
  absl::Status status = model_->DecodeBatch(states, tokens, &all);
  if (status.ok() && live_costs_ != nullptr) {
    live_costs_->RecordDecode(static_cast<int>(batch.size()),
                              absl::ToDoubleSeconds(absl::Now() - t0));
  }
  if (!status.ok() && batch.size() > 1) {
    // One bad step (e.g. a full cache) must not fail its batch-mates:
    // run each alone and give every caller its own status. DecodeBatch
    // validates before touching any state, so nothing ran yet.
    for (Step* s : batch) {
      s->status = model_->Decode(s->state, s->token, s->out);
      if (s->status.ok()) s->status = DrawRows({s}, *s->out, {0});
    }
  }
  const int H = model_->config().hidden_size;
  for (size_t i = 0; i < batch.size(); ++i) {
    Step* s = batch[i];
    if (!status.ok()) {
      if (batch.size() == 1) s->status = status;
      continue;
    }
    s->status = status;
    {
      s->out->rows = 1;
      s->out->first_position = s->state->length() - 1;
      s->out->logits.clear();
      if (s->out->want_logits) {
        s->status = model_->CopyLogitsRow(static_cast<int>(i), &s->out->logits);
      }
      s->out->hidden.assign(all.hidden.begin() + i * H,
                            all.hidden.begin() + (i + 1) * H);
      s->out->argmax = {all.argmax[i]};
      s->out->finite = {all.finite[i]};
    }
  }
  if (status.ok()) {
    std::vector<int32_t> rows(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) rows[i] = static_cast<int32_t>(i);
    const absl::Status drawn = DrawRows(batch, all, rows);
    if (!drawn.ok()) {
      for (Step* s : batch) {
        if (s->out->draw.has_value()) s->status = drawn;
      }
    }
  }
}

absl::Status ModelExecutor::DrawRows(const std::vector<Step*>& steps,
                                     const model::ForwardResult& pass,
                                     const std::vector<int32_t>& rows) {
  std::vector<int32_t> which;
  std::vector<sampling::SamplingConfig> configs;
  std::vector<float> uniforms;
  std::vector<Step*> asked;
  for (size_t i = 0; i < steps.size(); ++i) {
    Step* s = steps[i];
    s->out->drawn = -1;
    // A non-finite row gets no token: its caller reports it.
    if (!s->out->draw.has_value() || pass.finite[rows[i]] == 0) continue;
    which.push_back(rows[i]);
    configs.push_back(s->out->draw->config);
    uniforms.push_back(s->out->draw->uniform);
    asked.push_back(s);
  }
  if (asked.empty()) return absl::OkStatus();
  std::vector<int32_t> tokens;
  SS_RETURN_IF_ERROR(model_->SampleRows(which, configs, uniforms, &tokens));
  for (size_t j = 0; j < asked.size(); ++j) asked[j]->out->drawn = tokens[j];
  return absl::OkStatus();
}

void ModelExecutor::Together(GroupTask* task, const GroupTask::Runner& run) {
  task->run = &run;
  Combine(
      &groups_, task, [](const GroupTask& t) { return t.rows; },
      &ModelExecutor::RunGroup, &stats_.groups, &stats_.grouped);
}

void ModelExecutor::RunGroup(const std::vector<GroupTask*>& batch) {
  for (const GroupTask* t : batch) {
    CHECK(t->run == batch[0]->run) << "tasks of two runners in one group";
  }
  (*batch[0]->run)(batch);
}

ModelExecutor::Stats ModelExecutor::stats() const {
  absl::MutexLock lock(&queue_mu_);
  return stats_;
}

}  // namespace specserve::spec
