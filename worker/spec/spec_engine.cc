#include "worker/spec/spec_engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "kernels/sampling/sampling.h"
#include "telemetry/status_macros.h"
#include "worker/spec/spec_accept.h"

namespace specserve::spec {

using sampling::ArgmaxFirst;

namespace {

bool IsStop(const BurstParams& p, int32_t token) {
  return std::find(p.stop_ids.begin(), p.stop_ids.end(), token) !=
         p.stop_ids.end();
}

bool AllFinite(const float* x, int n) {
  for (int i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return false;
  }
  return true;
}

}  // namespace

absl::Status SpecEngine::NonFinite(const std::string& session) {
  return absl::InternalError(absl::StrCat(
      "session ", session,
      ": the model produced non-finite logits (NaN or inf); the request was "
      "stopped"));
}

TokenLogprobs SpecEngine::LogprobsOf(const BurstParams& p, const float* logits,
                                     int V, int32_t token) {
  return ComputeLogprobs(absl::MakeConstSpan(logits, V), p.sampling.temperature,
                         token, *p.logprobs);
}

absl::StatusOr<std::unique_ptr<SpecSession>> SpecEngine::Admit(
    const std::string& id, int capacity, absl::Span<const int32_t> history,
    std::optional<int> checkpoint_pos, bool speculative, int draft_depth,
    int prompt_rows) {
  const int n = static_cast<int>(history.size());
  if (n > capacity) {
    return absl::OutOfRangeError(
        absl::StrCat("session ", id, ": history of ", history.size(),
                     " tokens exceeds the capacity of ", capacity, " rows"));
  }
  const int checkpoint = checkpoint_pos.value_or(n);
  if (checkpoint < 0 || checkpoint > n) {
    return absl::OutOfRangeError(
        absl::StrCat("session ", id, ": checkpoint at ", checkpoint,
                     " lies outside its history of ", n, " tokens"));
  }
  if (speculative && (draft_depth < 1 || draft_depth > kMaxDraftDepth)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session ", id, ": draft depth ", draft_depth, " is outside 1..",
        kMaxDraftDepth, " (the draft depth limit)"));
  }
  model::StateOptions options;
  options.capacity = capacity;
  const bool drafts = speculative && model_->has_mtp();
  options.max_verify_columns = drafts ? draft_depth + 1 : 1;
  options.draft_state = drafts;
  // Pages a later fork can share, where the history fills one, laid out for
  // forks at the first prompt's end and its prefix checkpoints (and the
  // rebuilt history's checkpoint and end).
  const int prompt_end = std::max(n, prompt_rows);
  options.shareable = model_->WorthSharing(prompt_end);
  if (options.shareable) {
    options.share_rows = PrefixCheckpointTargets(0, prompt_end);
    options.share_rows.push_back(checkpoint);
    options.share_rows.push_back(n);
    options.share_rows.push_back(prompt_end);
  }
  // The caches are allocated and zeroed with the model held: backend work
  // from another thread while a step shape is being recorded would be
  // refused ("Allocate cannot be recorded") or, on a shared stream, land in
  // the recording.
  std::unique_ptr<model::ModelState> caches;
  const absl::Time asked = absl::Now();
  absl::Time held;
  SS_RETURN_IF_ERROR(executor_->Exclusive([&]() -> absl::Status {
    held = absl::Now();
    SS_ASSIGN_OR_RETURN(caches, model_->NewState(options));
    return absl::OkStatus();
  }));
  // Where an admission's time goes (GLOG_v=1).
  VLOG(1) << "admit " << id << ": waited " << absl::FormatDuration(held - asked)
          << ", allocated " << absl::FormatDuration(absl::Now() - held);
  auto s = std::make_unique<SpecSession>(id, std::move(caches), drafts);
  // Prefill is row-invariant: two parts give the bits of one.
  if (checkpoint > 0) {
    SS_RETURN_IF_ERROR(AppendInChunks(s.get(), history.first(checkpoint)));
    SS_RETURN_IF_ERROR(
        executor_->Exclusive([&] { return SaveCheckpointLocked(s.get()); }));
  }
  if (checkpoint < n) {
    SS_RETURN_IF_ERROR(AppendInChunks(s.get(), history.subspan(checkpoint)));
  }
  s->CheckInvariants();
  return s;
}

absl::Status SpecEngine::FillMtpLocked(SpecSession* s, int first_row,
                                       absl::Span<const float> hiddens,
                                       absl::Span<const int32_t> next_tokens) {
  if (!s->can_draft() || next_tokens.empty()) return absl::OkStatus();
  return model_->MtpForward(s->caches(), hiddens, next_tokens, first_row,
                            nullptr);
}

std::vector<int> SpecEngine::PrefixCheckpointTargets(int start, int end) const {
  std::vector<int> out;
  const int every = prefix_checkpoints_.interval;
  if (every <= 0 || prefix_checkpoints_.keep <= 0) return out;
  for (int q = (end - 1) / every * every;
       q > start && static_cast<int>(out.size()) < prefix_checkpoints_.keep;
       q -= every) {
    out.insert(out.begin(), q);
  }
  return out;
}

absl::Status SpecEngine::AppendInChunks(SpecSession* s,
                                        absl::Span<const int32_t> tokens,
                                        const PromptLogprobs* prompt_logprobs) {
  const int start = s->committed_len();
  const std::vector<int> targets =
      PrefixCheckpointTargets(start, start + static_cast<int>(tokens.size()));
  size_t next_target = 0;
  std::vector<std::unique_ptr<TurnCheckpoint>> saved;
  for (size_t i = 0; i < tokens.size();) {
    // Every row's logits take a logits row each: kMaxRows per pass then.
    // Chunks end at multiples of the delta rule's chunk (PrefillPassRows),
    // so that the prompt's bits do not depend on the chunk size chosen;
    // the prefix checkpoints are such multiples.
    const int max_rows = prompt_logprobs != nullptr
                             ? model::Model::kMaxRows
                             : executor_->PrefillChunkRows();
    const int at = s->caches()->length();
    int64_t left = static_cast<int64_t>(tokens.size() - i);
    if (next_target < targets.size()) {
      left = std::min<int64_t>(left, targets[next_target] - at);
    }
    const size_t rows = model::Model::PrefillPassRows(at, left, max_rows);
    const absl::Span<const int32_t> chunk = tokens.subspan(i, rows);
    i += chunk.size();
    SS_RETURN_IF_ERROR(AppendChunk(s, chunk, prompt_logprobs));
    if (next_target < targets.size() &&
        s->committed_len() == targets[next_target]) {
      ++next_target;
      SS_RETURN_IF_ERROR(executor_->Exclusive([&]() -> absl::Status {
        SS_ASSIGN_OR_RETURN(std::unique_ptr<TurnCheckpoint> c,
                            NewCheckpointLocked(*s));
        saved.push_back(std::move(c));
        return absl::OkStatus();
      }));
    }
  }
  if (!saved.empty()) {
    s->AddPrefixCheckpoints(std::move(saved), prefix_checkpoints_.keep);
  }
  return absl::OkStatus();
}

absl::Status SpecEngine::AppendChunk(SpecSession* s,
                                     absl::Span<const int32_t> chunk,
                                     const PromptLogprobs* prompt_logprobs) {
  if (prompt_logprobs != nullptr) {
    // Every row's logits: a pass of its own (Prefill with all_rows).
    return executor_->Interleaved(
        [&] { return AppendWithLogprobsLocked(s, chunk, *prompt_logprobs); });
  }
  // The chunk's MTP fill attends over the rows the session owes.
  if (!s->deferred_mtp().empty()) {
    SS_RETURN_IF_ERROR(executor_->Exclusive([&] { return FlushMtpLocked(s); }));
  }
  // The trunk pass, batched with other sessions' chunks; then the MTP
  // fill, which needs the model only when the session drafts.
  model::ForwardResult r;
  std::vector<float> row_hidden;
  SS_RETURN_IF_ERROR(executor_->Prefill(
      s->caches(), chunk, s->can_draft() ? &row_hidden : nullptr, &r));
  ++trunk_passes_;
  if (s->can_draft()) {
    return executor_->Exclusive(
        [&] { return FinishAppend(s, chunk, row_hidden, r); });
  }
  return FinishAppend(s, chunk, row_hidden, r);
}

absl::Status SpecEngine::AppendWithLogprobsLocked(
    SpecSession* s, absl::Span<const int32_t> chunk,
    const PromptLogprobs& prompt) {
  CHECK_LE(chunk.size(), static_cast<size_t>(model::Model::kMaxRows))
      << "one pass of prompt rows at a time";
  // The new rows' MTP fill attends over the owed ones.
  SS_RETURN_IF_ERROR(FlushMtpLocked(s));
  const int old_len = s->committed_len();
  const int H = model_->config().hidden_size;
  const int V = model_->config().vocab_size;
  const int n = static_cast<int>(chunk.size());
  // Every row's logits (one lm_head row each) and, for the MTP KV, every
  // row's hidden. Token i's logprobs come from the row before it: the stored
  // last logits for the chunk's first token when the session holds a
  // history (nothing is pending: the suffix comes after a flush).
  model::PrefillOptions options;
  options.all_rows = true;
  std::vector<float> row_hidden;
  if (s->can_draft()) options.all_hidden = &row_hidden;
  model::ForwardResult r;
  SS_RETURN_IF_ERROR(model_->Prefill(s->caches(), chunk, options, &r));
  ++trunk_passes_;
  const bool finite = r.AllFinite();  // non-finite logits fail FinishAppend
  if (finite) {
    std::vector<float> before;
    if (old_len > 0) before = s->last_logits();
    CHECK(old_len == 0 || static_cast<int>(before.size()) == V)
        << "session " << s->id() << ": no last logits before the suffix";
    for (int j = 0; j < n; ++j) {
      if (!before.empty()) {
        prompt.out->push_back(ComputeLogprobs(before, prompt.temperature,
                                              chunk[j], prompt.top_n));
      }
      before.assign(r.logits.begin() + static_cast<size_t>(j) * V,
                    r.logits.begin() + static_cast<size_t>(j + 1) * V);
    }
  }
  // Keep the last row only, as a plain prefill returns it.
  const int last = r.rows - 1;
  r.logits.assign(r.logits.begin() + static_cast<size_t>(last) * V,
                  r.logits.begin() + static_cast<size_t>(last + 1) * V);
  r.hidden.assign(r.hidden.begin() + static_cast<size_t>(last) * H,
                  r.hidden.begin() + static_cast<size_t>(last + 1) * H);
  r.argmax = {r.argmax[last]};
  r.finite = {finite ? 1 : 0};
  return FinishAppend(s, chunk, row_hidden, r);
}

absl::Status SpecEngine::FinishAppend(SpecSession* s,
                                      absl::Span<const int32_t> tokens,
                                      const std::vector<float>& row_hidden,
                                      const model::ForwardResult& r) {
  const int old_len = s->committed_len();
  const int H = model_->config().hidden_size;
  const int n = static_cast<int>(tokens.size());
  if (s->can_draft()) {
    // MTP row p takes (h_p, t_{p+1}) for p = old_len−1 .. new_len−2: the
    // previous last row's hidden (kept since the last turn) and every new
    // row but the last.
    std::vector<float> hiddens;
    std::vector<int32_t> next_tokens;
    int first_row = old_len;
    if (old_len > 0) {
      first_row = old_len - 1;
      hiddens = s->last_hidden();
    }
    hiddens.insert(hiddens.end(), row_hidden.begin(),
                   row_hidden.begin() + static_cast<size_t>(n - 1) * H);
    next_tokens.assign(tokens.begin(), tokens.end());
    if (old_len == 0) next_tokens.erase(next_tokens.begin());
    SS_RETURN_IF_ERROR(FillMtpLocked(s, first_row, hiddens, next_tokens));
  }
  s->committed.insert(s->committed.end(), tokens.begin(), tokens.end());
  // r holds the last row only.
  s->last_hidden() = r.hidden;
  s->last_logits() = r.logits;
  if (!r.AllFinite()) return NonFinite(s->id());
  s->next_pred = r.argmax[0];
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TurnCheckpoint>> SpecEngine::NewCheckpointLocked(
    const SpecSession& s) {
  auto c = std::make_unique<TurnCheckpoint>();
  c->pos = s.committed_len();
  SS_ASSIGN_OR_RETURN(c->trunk, model_->SaveCheckpoint(*s.caches()));
  c->last_hidden = const_cast<SpecSession&>(s).last_hidden();
  c->last_logits = const_cast<SpecSession&>(s).last_logits();
  return c;
}

absl::Status SpecEngine::SaveCheckpointLocked(SpecSession* s) {
  SS_ASSIGN_OR_RETURN(std::unique_ptr<TurnCheckpoint> c,
                      NewCheckpointLocked(*s));
  s->set_checkpoint(std::move(c));
  return absl::OkStatus();
}

absl::Status SpecEngine::CommitOne(SpecSession* s, int32_t tok,
                                   model::ForwardResult* out) {
  const int old_len = s->committed_len();
  SS_RETURN_IF_ERROR(executor_->Decode(s->caches(), tok, out));
  ++trunk_passes_;
  if (s->can_draft() && old_len > 0) {
    // MTP row old_len−1 pairs the previous last hidden with `tok`: owed,
    // written by the next FlushMtpLocked (in one pass with its neighbours).
    DeferredMtp& d = s->deferred_mtp();
    if (d.empty()) d.first_row = old_len - 1;
    d.hiddens.insert(d.hiddens.end(), s->last_hidden().begin(),
                     s->last_hidden().end());
    d.tokens.push_back(tok);
  }
  s->committed.push_back(tok);
  s->last_hidden() = out->hidden;
  // Without logits (a greedy step, which leaves a token pending) the old
  // ones are stale: last_logits is read only when nothing is pending.
  s->last_logits() = out->logits;
  return absl::OkStatus();
}

absl::Status SpecEngine::FlushMtpLocked(SpecSession* s) {
  DeferredMtp& d = s->deferred_mtp();
  if (d.empty()) return absl::OkStatus();
  SS_RETURN_IF_ERROR(FillMtpLocked(s, d.first_row, d.hiddens, d.tokens));
  d = DeferredMtp{};
  return absl::OkStatus();
}

absl::Status SpecEngine::Flush(SpecSession* s) {
  if (s->has_pending()) {
    model::ForwardResult r;
    SS_RETURN_IF_ERROR(CommitOne(s, *s->pending_tok, &r));
    s->pending_tok.reset();
    s->next_pred = r.argmax[0];
  }
  if (s->deferred_mtp().empty()) return absl::OkStatus();
  return executor_->Exclusive([&] { return FlushMtpLocked(s); });
}

absl::Status SpecEngine::Rewind(SpecSession* s) {
  TurnCheckpoint* c = s->checkpoint();
  if (c == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", s->id(), " has no prompt checkpoint to rewind to"));
  }
  if (!s->rewind_is_resident()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", s->id(), ": the checkpoint's rows are no longer resident"));
  }
  SS_RETURN_IF_ERROR(executor_->Exclusive(
      [&] { return model_->RestoreCheckpoint(s->caches(), *c->trunk); }));
  s->committed.resize(c->pos);
  s->pending_tok.reset();
  // Owed MTP rows past the checkpoint belong to the dropped tokens.
  DeferredMtp& d = s->deferred_mtp();
  const int keep = std::max(0, c->pos - 1 - d.first_row);
  if (d.empty() || keep == 0) {
    d = DeferredMtp{};
  } else if (keep < static_cast<int>(d.tokens.size())) {
    d.tokens.resize(keep);
    d.hiddens.resize(static_cast<size_t>(keep) * model_->config().hidden_size);
  }
  s->last_hidden() = c->last_hidden;
  s->last_logits() = c->last_logits;
  s->next_pred = static_cast<int32_t>(
      ArgmaxFirst(c->last_logits.data(), model_->config().vocab_size));
  return absl::OkStatus();
}

absl::Status SpecEngine::Demote(SpecSession* s) {
  SS_RETURN_IF_ERROR(Flush(s));
  if (!s->demote_ready()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", s->id(), " has no prediction to hand over (no turn yet)"));
  }
  s->MarkDemoted();
  // The batched path never drafts: free the MTP KV and verify captures.
  return executor_->Exclusive(
      [&] { return model_->FreeDraftState(s->caches()); });
}

absl::Status SpecEngine::CheckAdjustments(const SpecSession& s,
                                          const BurstParams& p) const {
  SS_RETURN_IF_ERROR(sampling::ValidateLogitAdjustments(
      p.adjust, model_->config().vocab_size));
  if (p.prior_output < 0 ||
      (p.prior_output > 0 && (p.rewind || !p.suffix.empty()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prior_output_tokens ", p.prior_output,
        " with a suffix or a rewind: a burst that starts a turn has none"));
  }
  const int history = s.committed_len() + (s.has_pending() ? 1 : 0);
  if (p.prior_output > history) {
    return absl::InvalidArgumentError(
        absl::StrCat("prior_output_tokens ", p.prior_output,
                     " exceeds the session's ", history, " tokens"));
  }
  return absl::OkStatus();
}

absl::Status SpecEngine::PrepareGrammarCursor(
    SpecSession* s, const BurstParams& p, absl::Span<const int32_t> history) {
  const int64_t length = static_cast<int64_t>(history.size());
  const int64_t output_start = length - p.prior_output;
  const std::optional<grammar::GrammarCursor>& c = s->grammar_cursor;
  // A burst that starts a turn starts an output; a continuation keeps the
  // cursor that followed its earlier bursts.
  const bool starts_output = p.rewind || !p.suffix.empty();
  if (!starts_output && c && c->key() == p.grammar->key() &&
      c->output_start() == output_start && c->length() == length) {
    return absl::OkStatus();
  }
  s->grammar_cursor.reset();
  SS_ASSIGN_OR_RETURN(grammar::GrammarCursor cursor,
                      grammar::GrammarCursor::Start(
                          *p.grammar, p.grammar->key(), output_start));
  for (int64_t i = output_start; i < length; ++i) cursor.Push(history[i]);
  s->grammar_cursor.emplace(std::move(cursor));
  return absl::OkStatus();
}

absl::StatusOr<int32_t> SpecEngine::ChooseAdjusted(const SpecSession& s,
                                                   const BurstCtx& b,
                                                   const float* logits,
                                                   int64_t pos) const {
  const BurstParams& p = b.params;
  const int V = model_->config().vocab_size;
  CHECK_EQ(b.controls->length(), pos)
      << "session " << s.id() << ": row controls out of step";
  if (!AllFinite(logits, V)) return NonFinite(s.id());
  std::vector<float> row(logits, logits + V);
  if (absl::Status applied = b.controls->Apply(absl::MakeSpan(row));
      !applied.ok()) {
    return absl::Status(applied.code(), absl::StrCat("session ", s.id(), ": ",
                                                     applied.message()));
  }
  const float u = p.sampling.greedy() ? 0.0f : PositionUniform(p.seed, pos);
  absl::StatusOr<int32_t> token = sampling::ChooseToken(row, p.sampling, u);
  if (!token.ok()) {
    return absl::Status(
        token.status().code(),
        absl::StrCat("session ", s.id(), ": ", token.status().message()));
  }
  return token;
}

absl::Status SpecEngine::RequestMask(const SpecSession& s, const BurstCtx& b,
                                     int64_t pos, int row,
                                     model::ForwardResult* r) const {
  CHECK_EQ(b.controls->length(), pos)
      << "session " << s.id() << ": row controls out of step";
  absl::StatusOr<bool> masked = b.controls->AppendMask(&r->mask_words);
  if (!masked.ok()) {
    return absl::Status(
        masked.status().code(),
        absl::StrCat("session ", s.id(), ": ", masked.status().message()));
  }
  if (*masked) r->mask_rows.push_back(row);
  return absl::OkStatus();
}

absl::StatusOr<int32_t> SpecEngine::Choose(SpecSession* s, const BurstCtx& b,
                                           const float* logits) {
  const BurstParams& p = b.params;
  const int V = model_->config().vocab_size;
  if (b.Injects(1) || !AllFinite(logits, V)) return NonFinite(s->id());
  // Nothing is pending: the token goes at index committed_len.
  if (b.adjusted()) return ChooseAdjusted(*s, b, logits, s->committed_len());
  if (p.sampling.greedy()) return ArgmaxFirst(logits, V);
  // Drawn on the backend (the stored row is copied there): the token at
  // index committed_len (nothing is pending).
  const float u = PositionUniform(p.seed, s->committed_len());
  int32_t token = -1;
  SS_RETURN_IF_ERROR(executor_->Exclusive([&]() -> absl::Status {
    SS_ASSIGN_OR_RETURN(token,
                        model_->SampleHostLogits(absl::MakeConstSpan(logits, V),
                                                 p.sampling, u));
    return absl::OkStatus();
  }));
  return token;
}

absl::Status SpecEngine::PlainStep(SpecSession* s, const BurstCtx& b,
                                   int32_t* next_token,
                                   std::vector<TokenLogprobs>* logprobs) {
  const BurstParams& p = b.params;
  model::ForwardResult r;
  // No logits come back unless logprobs are asked or the logit controls
  // adjust them on the host: greedy needs the device's argmax and
  // finiteness flag, and a sampled step has its token drawn on the backend
  // within the (batched) step.
  r.want_logits = p.logprobs.has_value() || b.on_host();
  // The pending token is at index committed_len; the new one follows it.
  if (b.masked_on_backend()) {
    SS_RETURN_IF_ERROR(RequestMask(*s, b, s->committed_len() + 1, 0, &r));
  }
  auto step = [&]() -> absl::Status {
    SS_RETURN_IF_ERROR(CommitOne(s, *s->pending_tok, &r));
    if (b.Injects(1) || !r.AllFinite()) return NonFinite(s->id());
    return absl::OkStatus();
  };
  if (b.on_host()) {
    SS_RETURN_IF_ERROR(step());
    // The pending token is committed now; the new one follows it.
    SS_ASSIGN_OR_RETURN(*next_token, ChooseAdjusted(*s, b, r.logits.data(),
                                                    s->committed_len()));
  } else if (p.sampling.greedy()) {
    SS_RETURN_IF_ERROR(step());
    *next_token = r.argmax[0];
  } else {
    // The pending token is at index committed_len; the drawn one follows it.
    r.draw = model::ForwardResult::Draw{
        p.sampling, PositionUniform(p.seed, s->committed_len() + 1)};
    SS_RETURN_IF_ERROR(step());
    *next_token = r.drawn;
  }
  if (p.logprobs) {
    logprobs->push_back(LogprobsOf(p, r.logits.data(),
                                   model_->config().vocab_size, *next_token));
  }
  s->pending_tok = *next_token;
  return absl::OkStatus();
}

absl::StatusOr<BurstResult> SpecEngine::RunBurst(SpecSession* s,
                                                 const BurstParams& p,
                                                 const EmitFn& emit) {
  return RunBurst(
      s, p, [&](absl::Span<const int32_t> t, absl::Span<const TokenLogprobs>) {
        return emit(t);
      });
}

absl::StatusOr<BurstResult> SpecEngine::RunBurst(
    SpecSession* s, const BurstParams& p, const EmitWithLogprobsFn& emit) {
  s->CheckInvariants();
  const SpecTelemetry before = s->telem;
  BurstCtx b{p};
  BurstResult result;
  SS_RETURN_IF_ERROR(CheckAdjustments(*s, p));
  if (p.rewind) SS_RETURN_IF_ERROR(Rewind(s));
  // A new turn, or a sampled one, starts from a flushed session.
  if (!p.suffix.empty() || !p.sampling.greedy()) SS_RETURN_IF_ERROR(Flush(s));
  result.cached_tokens = s->committed_len();
  const int capacity = s->cache_max_ctx();
  if (!p.suffix.empty()) {
    if (s->committed_len() + static_cast<int>(p.suffix.size()) > capacity) {
      return absl::OutOfRangeError(absl::StrCat(
          "session ", s->id(), ": ", s->committed_len(), " committed + ",
          p.suffix.size(), " new tokens exceed the capacity of ", capacity,
          " rows"));
    }
    PromptLogprobs prompt;
    if (p.prompt_logprobs) {
      prompt.top_n = *p.prompt_logprobs;
      prompt.temperature = p.sampling.temperature;
      prompt.out = &result.prompt_logprobs;
    }
    SS_RETURN_IF_ERROR(
        AppendInChunks(s, p.suffix, p.prompt_logprobs ? &prompt : nullptr));
  }
  // The new prompt's checkpoint (the turn's rewind target) is saved before
  // the first pass that changes the caches, but after the first token: that
  // one needs no pass (next_pred), so the client sees it without waiting
  // for the model again (a checkpoint copies every linear layer's state).
  bool checkpoint_owed = !p.suffix.empty();
  auto save_owed_checkpoint = [&]() -> absl::Status {
    if (!checkpoint_owed) return absl::OkStatus();
    checkpoint_owed = false;
    return executor_->Exclusive([&] { return SaveCheckpointLocked(s); });
  };
  if (s->committed.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("session ", s->id(), " has no tokens to continue from"));
  }
  // The logit controls' view of the history, rebuilt from the session's
  // tokens at every burst: a rewind, a rebuild or a fork restores it with
  // the history. The grammar's cursor is the session's (rebuilt from the
  // history when it does not fit). Both follow every emitted token
  // (deliver below).
  if (!p.grammar) s->grammar_cursor.reset();
  std::optional<RowControls> controls;
  if (p.adjust.active() || p.grammar) {
    std::vector<int32_t> history = s->committed;
    if (s->has_pending()) history.push_back(*s->pending_tok);
    if (p.grammar) SS_RETURN_IF_ERROR(PrepareGrammarCursor(s, p, history));
    controls.emplace(p.adjust, history, p.prior_output,
                     p.grammar ? &*s->grammar_cursor : nullptr);
    b.controls = &*controls;
    b.host_rows =
        p.adjust.active() || p.logprobs.has_value() || p.grammar_on_host;
  }

  // From here the burst streams: passes wait for it between its steps.
  ModelExecutor::LoopMember streaming(executor_);

  auto finish = [&](BurstEnd end) -> absl::StatusOr<BurstResult> {
    SS_RETURN_IF_ERROR(save_owed_checkpoint());
    // A burst boundary owes no MTP rows (offload, forks and the next
    // turn's prefill read them).
    if (!s->deferred_mtp().empty()) {
      SS_RETURN_IF_ERROR(
          executor_->Exclusive([&] { return FlushMtpLocked(s); }));
    }
    result.end = end;
    result.overshoot = std::max(0, result.produced - p.max_new);
    result.telemetry_delta = s->telem.DeltaSince(before);
    s->CheckInvariants();
    return result;
  };
  auto deliver = [&](absl::Span<const int32_t> tokens,
                     absl::Span<const TokenLogprobs> logprobs) {
    bool stop = false;
    for (int32_t t : tokens) {
      stop = stop || IsStop(p, t);
      if (b.adjusted()) {
        b.controls->Push(t);
        stop = stop || b.controls->grammar_done();
      }
    }
    result.produced += static_cast<int>(tokens.size());
    b.produced = result.produced;
    bool keep_going = emit(tokens, logprobs);
    return std::make_pair(keep_going, stop);
  };

  // The first token: the carried pending one was already emitted; otherwise
  // emit the prediction after the last committed row (no pass needed).
  if (!s->has_pending()) {
    if (s->committed_len() + 1 > capacity) return finish(BurstEnd::kCapacity);
    if (p.max_new <= 0) return finish(BurstEnd::kMaxNew);
    // A failed first token still leaves the new prompt's checkpoint saved.
    auto failed = [&](absl::Status why) {
      save_owed_checkpoint().IgnoreError();
      return why;
    };
    int32_t first;
    if (p.sampling.greedy() && !b.adjusted()) {
      if (b.Injects(1)) return failed(NonFinite(s->id()));
      first = *s->next_pred;
    } else {
      absl::StatusOr<int32_t> chosen = Choose(s, b, s->last_logits().data());
      if (!chosen.ok()) return failed(chosen.status());
      first = *chosen;
    }
    std::vector<TokenLogprobs> first_logprobs;
    if (p.logprobs) {
      // Nothing is pending, so the stored last logits are the row that
      // chose `first` (its next_pred, or its draw).
      const int V = model_->config().vocab_size;
      CHECK_EQ(static_cast<int>(s->last_logits().size()), V)
          << "session " << s->id() << ": no last logits";
      first_logprobs.push_back(
          LogprobsOf(p, s->last_logits().data(), V, first));
    }
    s->next_pred.reset();
    s->pending_tok = first;
    auto [go, stop] = deliver({first}, first_logprobs);
    if (stop) return finish(BurstEnd::kStopToken);
    if (!go) return finish(BurstEnd::kCancelled);
  }

  SS_RETURN_IF_ERROR(save_owed_checkpoint());
  while (result.produced < p.max_new) {
    // Rows a step needs: the pending token's, k drafts', and one for the
    // next pending token (so every emitted token stays committable).
    const int room = capacity - s->committed_len() - 2;
    if (room < 0) return finish(BurstEnd::kCapacity);
    // A round emits up to k + 1 tokens: under max_emit it drafts at most
    // one fewer than are left (0: a plain step emits the last one).
    const int emit_room = p.max_emit ? *p.max_emit - result.produced - 1 : p.k;
    const int k = s->can_draft()
                      ? std::min({p.k, room, emit_room,
                                  s->caches()->max_verify_columns() - 1})
                      : 0;
    std::vector<int32_t> emitted;
    std::vector<TokenLogprobs> logprobs;
    if (k > 0) {
      SS_RETURN_IF_ERROR(Round(s, b, k, &emitted, &logprobs));
    } else {
      int32_t next;
      SS_RETURN_IF_ERROR(PlainStep(s, b, &next, &logprobs));
      emitted = {next};
    }
    auto [go, stop] = deliver(emitted, logprobs);
    if (stop) return finish(BurstEnd::kStopToken);
    if (!go) return finish(BurstEnd::kCancelled);
  }
  return finish(BurstEnd::kMaxNew);
}

}  // namespace specserve::spec
