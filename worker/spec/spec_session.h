// One speculative session on a worker: the token truth of its caches, the
// carried pending token, the turn checkpoint and the acceptance telemetry (the
// session contract, docs/DESIGN.md §1). The round loop lives in spec_engine.h;
// this type owns the state and states its invariants.
//
// Invariants at every burst boundary (checked by CheckInvariants()):
//  - committed.size() == caches.length() (every committed token has trunk KV
//    and recurrent/conv state; overshoot included);
//  - pending_tok set  ⇒ next_pred absent, and the pending token is NOT in
//    `committed` although the client has already been sent it;
//  - the stored last hidden is the last committed row's (the chain seed);
//  - no cache row at or past capacity was ever written;
//  - the MTP rows of plain steps not yet written (deferred_mtp) are the
//    rows just before committed_len − 1, contiguous; a flushed session
//    (Flush, the end of a burst) has none.
#ifndef SPECSERVE_WORKER_SPEC_SPEC_SESSION_H_
#define SPECSERVE_WORKER_SPEC_SPEC_SESSION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "telemetry/spec_telemetry.h"
#include "worker/grammar/grammar_cursor.h"
#include "worker/model/model.h"
#include "worker/spec/spec_accept.h"

namespace specserve::spec {

using telemetry::SpecTelemetry;

// The state at the end of the last turn's prompt ("regenerate" resumes here).
struct TurnCheckpoint {
  int pos = 0;  // committed length at the prompt's end
  std::unique_ptr<model::TrunkCheckpoint> trunk;  // recurrent + conv copies
  std::vector<float> last_hidden;  // hidden of row pos−1 (chain seed)
  std::vector<float> last_logits;  // logits of row pos−1
};

enum class DecodeMode { kSpeculative, kBatched };

// The MTP rows a session's plain steps owe its draft state: row first_row + i
// pairs hiddens[i] ([H]) with tokens[i]. Written in one MTP pass when the
// session next drafts, prefills or ends its burst, so a plain step never
// runs a pass of its own outside the batched decode.
struct DeferredMtp {
  int first_row = 0;
  std::vector<float> hiddens;
  std::vector<int32_t> tokens;
  bool empty() const { return tokens.empty(); }
  int end_row() const { return first_row + static_cast<int>(tokens.size()); }
};

class SpecSession {
 public:
  // `has_mtp`: the session can draft (the model has an MTP head and the
  // session was admitted with draft state).
  SpecSession(std::string id, std::unique_ptr<model::ModelState> caches,
              bool has_mtp);

  const std::string& id() const { return id_; }

  // Every token whose state the caches hold, in order, overshoot included.
  std::vector<int32_t> committed;
  // Greedy argmax after committed.back(); absent before the first turn and
  // while a pending token is carried.
  std::optional<int32_t> next_pred;
  // (Sampled decoding keeps no random state here: each token's uniform is
  // a function of (seed, its position), spec_accept.h.)
  // Bonus of the last round: emitted, not yet in the caches.
  std::optional<int32_t> pending_tok;
  SpecTelemetry telem;
  // The position in the grammar of the request whose output the history
  // ends with (SpecEngine keeps it between that request's bursts); empty
  // when the last request had none.
  std::optional<grammar::GrammarCursor> grammar_cursor;

  // Rows the caches can hold (the ContextFull guard).
  int cache_max_ctx() const { return caches_->capacity(); }
  // Position of the retained prompt-end checkpoint, if any.
  std::optional<int> rewind_pos() const;
  // Whether every row the checkpoint needs is in this session's caches
  // (false while offloaded, or after the checkpoint rows were overwritten).
  bool rewind_is_resident() const;
  // Ready for the one-way handoff to batched decode: flushed, with a
  // prediction to hand over.
  bool demote_ready() const { return !pending_tok && next_pred.has_value(); }
  bool has_pending() const { return pending_tok.has_value(); }
  int committed_len() const { return static_cast<int>(committed.size()); }

  DecodeMode mode() const { return mode_; }
  // Whether speculative rounds are possible: an MTP head and not demoted.
  bool can_draft() const {
    return has_mtp_ && mode_ == DecodeMode::kSpeculative;
  }
  // Hands the session to plain batched decode: frees the draft state and the
  // checkpoint. Requires demote_ready(); one-way.
  void MarkDemoted();

  // The draft-graph failure memo (CUDA graphs): cleared on pool resume so a
  // new request gets one fresh capture chance. A no-op flag on the CPU.
  bool graph_fallback() const { return graph_fallback_; }
  void set_graph_fallback() { graph_fallback_ = true; }
  // Returns whether a flag was set (and logs once if so).
  bool reset_graph_fallback_on_resume();

  model::ModelState* caches() { return caches_.get(); }
  const model::ModelState* caches() const { return caches_.get(); }
  // Hidden and logits of the last committed row. The hidden is valid once
  // committed is non-empty; the logits only while no token is pending
  // (they choose a burst's first token; greedy steps that leave a token
  // pending do not copy them from the device).
  std::vector<float>& last_hidden() { return last_hidden_; }
  std::vector<float>& last_logits() { return last_logits_; }

  DeferredMtp& deferred_mtp() { return deferred_mtp_; }
  const DeferredMtp& deferred_mtp() const { return deferred_mtp_; }

  TurnCheckpoint* checkpoint() { return checkpoint_.get(); }
  void set_checkpoint(std::unique_ptr<TurnCheckpoint> c) {
    checkpoint_ = std::move(c);
  }

  // States saved inside prompts as they were prefilled (SpecEngine's
  // prefix checkpoints, docs/DESIGN.md "Prefix reuse"), ascending by pos,
  // each the state after committed[0:pos]. One holds while pos <=
  // committed_len(): rows below the committed length are never rewritten.
  // The pool drops them when it offloads the session, so every one held is
  // resident.
  const std::vector<std::unique_ptr<TurnCheckpoint>>& prefix_checkpoints()
      const {
    return prefix_checkpoints_;
  }
  // Adds `c` (ascending past the ones held that still hold), then keeps the
  // `keep` of highest pos.
  void AddPrefixCheckpoints(std::vector<std::unique_ptr<TurnCheckpoint>> c,
                            int keep);
  void DropPrefixCheckpoints() { prefix_checkpoints_.clear(); }
  // The prefix checkpoint at `pos` that still holds, or null.
  const TurnCheckpoint* PrefixCheckpointAt(int pos) const;
  // The positions of those that still hold, ascending.
  std::vector<int> prefix_checkpoint_positions() const;

  // CHECK-fails on a broken invariant (see the file comment).
  void CheckInvariants() const;

 private:
  const std::string id_;
  std::unique_ptr<model::ModelState> caches_;
  const bool has_mtp_;
  std::vector<float> last_hidden_;
  std::vector<float> last_logits_;
  DeferredMtp deferred_mtp_;
  std::unique_ptr<TurnCheckpoint> checkpoint_;
  std::vector<std::unique_ptr<TurnCheckpoint>> prefix_checkpoints_;
  DecodeMode mode_ = DecodeMode::kSpeculative;
  bool graph_fallback_ = false;
};

}  // namespace specserve::spec

#endif  // SPECSERVE_WORKER_SPEC_SPEC_SESSION_H_
