// The speculative-session engine: admit, bursts of speculative rounds or plain
// decode steps, flush, rewind, demotion — over one Model (docs/DESIGN.md §1,
// §3).
//
// A burst emits tokens through a callback as they are produced; every emitted
// token is either committed or the carried pending token, so nothing the
// client saw is ever lost. Rounds end at round boundaries only: max_new may be
// overshot by up to k (reported), a stop token ends the burst after its round.
//
// Thread safety: one engine call at a time per session (the caller's session
// lease guarantees it); calls on different sessions may run concurrently:
// every model call goes through the ModelExecutor, which serializes them and
// batches concurrent sessions' work (plain-decode steps, prompt chunks, whole
// speculative rounds).
#ifndef SPECSERVE_WORKER_SPEC_SPEC_ENGINE_H_
#define SPECSERVE_WORKER_SPEC_SPEC_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/sampling/logit_adjust.h"
#include "kernels/sampling/sampling.h"
#include "proto/api_limits.h"
#include "worker/grammar/grammar.h"
#include "worker/model/model.h"
#include "worker/spec/logprobs.h"
#include "worker/spec/model_executor.h"
#include "worker/spec/row_controls.h"
#include "worker/spec/spec_session.h"

namespace specserve::spec {

struct BurstParams {
  std::vector<int32_t> suffix;  // new turn tokens; empty = continue
  bool rewind = false;          // back to the prompt checkpoint first
  int max_new = 32;             // tokens to produce (a round may overshoot)
  int k = 0;                    // draft depth; 0 = plain decode steps
  sampling::SamplingConfig sampling;  // temperature 0 = greedy
  uint64_t seed = 0;
  std::vector<int32_t> stop_ids;  // end the burst at a round boundary
  // vLLM's logit controls (kernels/sampling/logit_adjust.h; their stop_ids
  // are the ones min_tokens masks). When active, every row that chooses a
  // token (a burst's first, a plain step's, each verify column, each draft)
  // is copied to the host, adjusted at its own position and picked there
  // (sampling::ChooseToken), plain and speculative alike.
  sampling::LogitAdjustments adjust;
  // Set: the request's grammar (worker/grammar). Every row that chooses a
  // token is masked by it at its own prefix (RowControls). A grammar alone
  // masks on the backend: the pass gets each row's allowed-token words
  // (ForwardResult::mask_rows) and picks there, so no [V] row travels to
  // the host. With active logit controls, logprobs or grammar_on_host, the
  // rows are copied to the host and masked there after the controls, as
  // above (the same tokens: kernels/token_mask.h). The session keeps its
  // position between bursts (SpecSession::grammar_cursor) and a burst
  // rebuilds it from the history when it does not hold this grammar at
  // this output. Once the grammar accepts its stop token the burst ends
  // (kStopToken).
  std::optional<grammar::CompiledGrammar> grammar;
  // Masks a grammar's rows on the host even without logit controls (the
  // reference the backend's mask is tested against).
  bool grammar_on_host = false;
  // Tokens of the request's output the history already ends with (earlier
  // bursts'); 0 when the burst brings a suffix or rewinds.
  int prior_output = 0;
  // Set (>= max_new): the most tokens the burst emits; rounds draft no
  // deeper than keeps them within it (no overshoot past it).
  std::optional<int> max_emit;
  // Fault injection (docs/RELIABILITY.md row 8): the logits behind the n-th
  // produced token become NaN. 0 = off.
  int inject_nan_at = 0;
  // Set: every emitted token carries its logprobs with this many top
  // alternatives (0..kMaxTopLogprobs), from the logits that chose it.
  std::optional<int> logprobs;
  // Set: the suffix's tokens get their logprobs (BurstResult), each from
  // the row before it; a suffix that starts the history has none for its
  // first token.
  std::optional<int> prompt_logprobs;
};

enum class BurstEnd { kMaxNew, kStopToken, kCapacity, kCancelled };

struct BurstResult {
  BurstEnd end = BurstEnd::kMaxNew;
  int produced = 0;   // tokens emitted by this burst
  int overshoot = 0;  // produced past max_new
  // Rows of the prompt served from the caches instead of prefilled.
  int cached_tokens = 0;
  SpecTelemetry telemetry_delta;
  // With BurstParams::prompt_logprobs: suffix tokens 1.. (0.. when the
  // session held history before the suffix), in order.
  std::vector<TokenLogprobs> prompt_logprobs;
};

// Receives newly emitted tokens; returns false to cancel the burst (it then
// ends at the next round boundary with kCancelled).
using EmitFn = std::function<bool(absl::Span<const int32_t>)>;
// The same, with each token's logprobs (one per token, in order) when
// BurstParams::logprobs is set; empty otherwise.
using EmitWithLogprobsFn = std::function<bool(absl::Span<const int32_t>,
                                              absl::Span<const TokenLogprobs>)>;

// Prefix checkpoints (docs/DESIGN.md "Prefix reuse"): while a prompt is
// prefilled, the state at every multiple of `interval` inside it is a place
// a later request sharing only part of the prompt (a system prompt with
// another question) can resume from. The engine cuts the prefill's passes
// there and saves the `keep` of them nearest the prompt's end (each holds
// one copy of every linear layer's state). interval 0: none.
struct PrefixCheckpointOptions {
  int interval = 0;  // a multiple of kernels::kPrefillDeltaRuleChunk
  int keep = 2;
};

class SpecEngine {
 public:
  explicit SpecEngine(ModelExecutor* executor,
                      PrefixCheckpointOptions prefix_checkpoints = {})
      : executor_(executor),
        model_(executor->model()),
        round_runner_([this](absl::Span<ModelExecutor::GroupTask* const> t) {
          RunRounds(t);
        }),
        prefix_checkpoints_(prefix_checkpoints) {}

  // A new session with caches for `capacity` rows, prefilled with `history`
  // (may be empty), its prompt checkpoint at `checkpoint_pos` (unset: the
  // end of the history). OUT_OF_RANGE when history does not fit or the
  // checkpoint lies past it.
  // A speculative session holds draft state for rounds of up to
  // `draft_depth` drafts, 1..kMaxDraftDepth (proto/api_limits.h; anything
  // else is INVALID_ARGUMENT). Its verify captures are sized for that depth,
  // and a burst asking for more (at most kMaxDraftDepth: BurstRequest's
  // check) runs its rounds at it. A plain session (speculative = false)
  // holds none, whatever `draft_depth`: a fraction of the memory, and it
  // never drafts.
  // `prompt_rows`: the rows the session will hold once its first prompt is
  // in (0: the history's); where they fill a page the backend can share,
  // its attention caches are built so that a fork can share them.
  absl::StatusOr<std::unique_ptr<SpecSession>> Admit(
      const std::string& id, int capacity, absl::Span<const int32_t> history,
      std::optional<int> checkpoint_pos = std::nullopt, bool speculative = true,
      int draft_depth = kMaxDraftDepth, int prompt_rows = 0);

  absl::StatusOr<BurstResult> RunBurst(SpecSession* s, const BurstParams& p,
                                       const EmitWithLogprobsFn& emit);
  absl::StatusOr<BurstResult> RunBurst(SpecSession* s, const BurstParams& p,
                                       const EmitFn& emit);

  // Commits a carried pending token (one single-token trunk pass).
  absl::Status Flush(SpecSession* s);
  // Back to the last prompt checkpoint: committed = committed[0:pos].
  absl::Status Rewind(SpecSession* s);
  // Flush, then the one-way handoff to plain decode.
  absl::Status Demote(SpecSession* s);

  // Trunk passes (prefill, decode, verify) run so far: lets tests check that
  // continuation bursts run no solo passes.
  int64_t trunk_passes() const { return trunk_passes_.load(); }

  model::Model* model() const { return model_; }

 private:
  // Per-burst bookkeeping (bursts of different sessions run concurrently).
  struct BurstCtx {
    const BurstParams& params;
    int produced = 0;  // tokens emitted so far in this burst
    // With active logit controls or a grammar: the history up to the next
    // token to choose (committed, the pending token, and the drafts being
    // tried by the round in flight); null otherwise.
    RowControls* controls = nullptr;
    // Whether rows are chosen on the host from their logits (logit
    // controls, logprobs, grammar_on_host); false with controls: a grammar
    // alone, masked on the backend.
    bool host_rows = false;
    bool adjusted() const { return controls != nullptr; }
    bool on_host() const { return adjusted() && host_rows; }
    bool masked_on_backend() const { return adjusted() && !host_rows; }
    // Whether fault injection poisons one of the next `columns` tokens.
    bool Injects(int columns) const {
      return params.inject_nan_at > produced &&
             params.inject_nan_at <= produced + columns;
    }
  };

  // Where a turn's prompt logprobs go: every token's logprobs
  // (ComputeLogprobs, top_n, temperature) from the row before it, the
  // history's first token excepted.
  struct PromptLogprobs {
    int top_n = 0;
    float temperature = 0.0f;
    std::vector<TokenLogprobs>* out = nullptr;
  };
  // Appends `chunk` (at most Model::kMaxRows tokens) in one pass that keeps
  // every row's logits, appending the chunk's prompt logprobs to `prompt`,
  // then FinishAppend. Requires the model lock.
  absl::Status AppendWithLogprobsLocked(SpecSession* s,
                                        absl::Span<const int32_t> chunk,
                                        const PromptLogprobs& prompt);
  // What follows a prompt chunk's trunk pass, given that pass's last row
  // `r` and (for a drafting session) every row's hidden: the MTP fill, the
  // committed tokens, the last hidden and logits, next_pred. Requires the
  // model lock when the session drafts (the MTP fill runs the head).
  absl::Status FinishAppend(SpecSession* s, absl::Span<const int32_t> tokens,
                            const std::vector<float>& row_hidden,
                            const model::ForwardResult& r);
  // Appends `tokens` to the caches (prefill), refreshing MTP rows and the
  // last hidden/logits, and sets next_pred; with `prompt_logprobs`, their
  // logprobs too. In chunks (ModelExecutor::PrefillChunkRows: whole passes
  // while nothing streams, short ones between streaming sessions' steps;
  // kMaxRows with logprobs), each trunk pass batched
  // with other sessions' chunks (ModelExecutor::Prefill; with logprobs, a
  // pass of its own through Interleaved) and run once every streaming
  // session has had its next step, so that they step between the chunks.
  // Any chunking gives the bits of one prefill: prefill and the MTP fill are
  // row-invariant, and each chunk continues from the last hidden and logits
  // the one before it left.
  // Cuts its passes at the prefix checkpoints inside `tokens` and saves
  // them (PrefixCheckpointOptions); a cut at a multiple of the delta rule's
  // chunk changes no bits.
  absl::Status AppendInChunks(SpecSession* s, absl::Span<const int32_t> tokens,
                              const PromptLogprobs* prompt_logprobs = nullptr);
  // One chunk of AppendInChunks: its trunk pass (batched with other
  // sessions' chunks; with logprobs, a pass of its own) and FinishAppend.
  absl::Status AppendChunk(SpecSession* s, absl::Span<const int32_t> chunk,
                           const PromptLogprobs* prompt_logprobs);
  // The positions AppendInChunks saves for a prompt [start, end): the
  // `keep` highest multiples of the interval strictly inside it.
  std::vector<int> PrefixCheckpointTargets(int start, int end) const;
  // MTP rows [first_row, first_row + n) from true trunk hiddens. Requires
  // the model lock.
  absl::Status FillMtpLocked(SpecSession* s, int first_row,
                             absl::Span<const float> hiddens,
                             absl::Span<const int32_t> next_tokens);
  // Commits `tok` with one (batched) decode step and refreshes the MTP row
  // before it; `out` gets the step's outputs.
  absl::Status CommitOne(SpecSession* s, int32_t tok,
                         model::ForwardResult* out);
  // For a grammar masked on the backend (b.masked_on_backend()): row `row`
  // of `r`'s pass gets the grammar's mask for the token at history index
  // `pos` (b.controls' length, CHECKed), or none where the grammar does
  // not constrain it. OUT_OF_RANGE, naming the session, on a dead end.
  absl::Status RequestMask(const SpecSession& s, const BurstCtx& b, int64_t pos,
                           int row, model::ForwardResult* r) const;
  // Picks the token after `logits` (greedy or sampled).
  absl::StatusOr<int32_t> Choose(SpecSession* s, const BurstCtx& b,
                                 const float* logits);
  // With active logit controls: the token the raw row `logits` ([V])
  // chooses at history index b.controls->length(), which must be `pos`:
  // adjusted there and picked on the host (greedy argmax, or the draw at
  // that position's uniform). Checks finiteness first.
  absl::StatusOr<int32_t> ChooseAdjusted(const SpecSession& s,
                                         const BurstCtx& b, const float* logits,
                                         int64_t pos) const;
  // The session's grammar cursor for the burst `p` (which has a grammar),
  // `history` the session's tokens (committed and pending): kept when it
  // holds p's grammar at this output, else started again and fed the
  // output's tokens from the history.
  absl::Status PrepareGrammarCursor(SpecSession* s, const BurstParams& p,
                                    absl::Span<const int32_t> history);
  // The checks of p's logit controls and prior_output against this model
  // and the session `s`, before the burst touches it.
  absl::Status CheckAdjustments(const SpecSession& s,
                                const BurstParams& p) const;
  // One plain step: commits the pending token, picks the next (and its
  // logprobs into `logprobs` when the burst asks for them).
  absl::Status PlainStep(SpecSession* s, const BurstCtx& b, int32_t* next_token,
                         std::vector<TokenLogprobs>* logprobs);
  // One speculative round with draft depth k: emits accepted drafts and the
  // bonus into `emitted`, with their logprobs from the verify columns that
  // chose them when the burst asks. Queued with the rounds of the other
  // streaming speculative sessions (ModelExecutor::Together): one group
  // runs all of them as shared passes (round_group.cc).
  absl::Status Round(SpecSession* s, const BurstCtx& b, int k,
                     std::vector<int32_t>* emitted,
                     std::vector<TokenLogprobs>* logprobs);
  struct RoundTask;
  // The group runner (the model held): every task's round, the tasks
  // together; if a shared pass is refused, each task's round alone.
  void RunRounds(absl::Span<ModelExecutor::GroupTask* const> tasks);
  // The rounds of `tasks` as shared passes: the k draft steps (the first
  // with the MTP rows each session owes), one verify, then each accept.
  // Returns a shared pass's refusal (checked before it ran); a session's
  // own failure (non-finite logits) goes to its task's status.
  absl::Status RoundsLocked(absl::Span<RoundTask* const> tasks);
  // The draft step `step` of the tasks still drafting, in as few MTP passes
  // as kMaxRows allows.
  absl::Status DraftStepLocked(absl::Span<RoundTask* const> tasks, int step);
  // The round's accept step (the model held): commits the accepted
  // columns and defers the MTP rows of the accepted tokens to the next
  // round's first draft pass (or the next flush).
  absl::Status AcceptLocked(RoundTask* t);
  // With active logit controls: every verify column's target, adjusted at
  // the column's own prefix and picked on the host, into t->target.
  absl::Status AdjustedTargetsLocked(RoundTask* t);
  static absl::Status NonFinite(const std::string& session);
  // The logprobs of `token`, chosen from the row `logits` ([V]) of a burst
  // that asked for them (the target distribution after temperature).
  static TokenLogprobs LogprobsOf(const BurstParams& p, const float* logits,
                                  int V, int32_t token);
  absl::Status SaveCheckpointLocked(SpecSession* s);
  // A checkpoint of `s` as it stands (its committed end). Requires the
  // model lock.
  absl::StatusOr<std::unique_ptr<TurnCheckpoint>> NewCheckpointLocked(
      const SpecSession& s);
  // Writes the MTP rows the session's plain steps owe (DeferredMtp).
  absl::Status FlushMtpLocked(SpecSession* s);

  ModelExecutor* const executor_;
  model::Model* const model_;
  const ModelExecutor::GroupTask::Runner round_runner_;
  const PrefixCheckpointOptions prefix_checkpoints_;
  std::atomic<int64_t> trunk_passes_{0};
};

}  // namespace specserve::spec

#endif  // SPECSERVE_WORKER_SPEC_SPEC_ENGINE_H_
