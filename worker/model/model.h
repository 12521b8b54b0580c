// The qwen3_5 text model (dense MLP) with its MTP head, written against the
// kernels::Backend interface: the contract of the forward. This header lists
// the config, the weights, a session's caches and every buffer's shape; the
// math is docs/MODEL.md. CPU and CUDA run this same forward.
//
// Usage:
//   SS_ASSIGN_OR_RETURN(auto model, Model::Load(dir, backend));
//   SS_ASSIGN_OR_RETURN(auto state, model->NewState({.capacity = 4096}));
//   ForwardResult r;
//   SS_RETURN_IF_ERROR(model->Prefill(state.get(), prompt, {}, &r));  // last
//   row SS_RETURN_IF_ERROR(model->Decode(state.get(), next, &r));
//   // speculative round:
//   SS_RETURN_IF_ERROR(model->Verify(state.get(), {pending, d1, d2, d3}, &r));
//   SS_RETURN_IF_ERROR(model->CommitVerified(state.get(), accepted_column));
//   // one token for each of several sessions, matmuls batched:
//   SS_RETURN_IF_ERROR(model->DecodeBatch({s1, s2, s3}, {t1, t2, t3}, &r));
//   // session pool: free the backend memory, keep the rows on the host:
//   SS_ASSIGN_OR_RETURN(auto snap, model->Offload(state.get()));
//   SS_RETURN_IF_ERROR(model->Restore(state.get(), *snap));
//
// Exactness (docs/DESIGN.md §3, §6): every kernel is row-invariant, so
//  - Verify column j's logits, hidden, recurrent and conv state are
//    bit-identical to Decode of the same tokens one at a time;
//  - Prefill runs the backend's prefill forms (kernels/backend.h): any
//    chunking gives the same bits, and it is bit-identical to
//    token-by-token Decode where those forms are exact (the CPU), within the
//    prefill tolerance otherwise (DESIGN.md "Prefill tolerance");
//  - DecodeBatch row i is bit-identical to Decode of session i alone;
//  - a state after Offload + Restore behaves bit-identically to one never
//    offloaded.
// Notation: H hidden, V vocab, I intermediate; nh/nkv/hd attention heads,
// kv heads, head dim; nk/nv/dk/dv linear key/value heads and dims; Kc conv
// kernel; key_dim = nk·dk, value_dim = nv·dv, conv_dim = 2·key_dim+value_dim;
// R = Model::kMaxRows rows per pass.
//
// Threading: one Model may serve many ModelStates, but forward calls on one
// Model must not run concurrently (they share the workspace and the backend).
#ifndef SPECSERVE_WORKER_MODEL_MODEL_H_
#define SPECSERVE_WORKER_MODEL_MODEL_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/backend.h"
#include "kernels/sampling/sampling.h"
#include "worker/model_files/checkpoint.h"
#include "worker/model_files/model_config.h"

namespace specserve::model {

using kernels::Buffer;  // backend memory; fp32 unless noted
using kernels::Weight;  // [rows][cols] matrix in its storage dtype
using model_files::LayerType;
using model_files::ModelConfig;

// ---------------------------------------------------------------- weights

struct AttentionWeights {  // gated full attention
  // [2·nh·hd + 2·nkv·hd][H]: the checkpoint's q_proj (per head [query hd |
  // gate hd]), k_proj and v_proj stacked, so one matmul projects all three.
  Weight qkv_proj;
  Weight o_proj;  // [H][nh·hd]
  Buffer q_norm;  // [hd] zero-centred
  Buffer k_norm;  // [hd] zero-centred
};

struct LinearAttentionWeights {  // Gated DeltaNet
  // [in_proj_dim][H]: the checkpoint's in_proj_qkv ([q nk·dk | k nk·dk |
  // v nv·dv]), in_proj_z [value_dim], in_proj_b [nv] and in_proj_a [nv]
  // stacked in that order, so one matmul projects all four.
  Weight in_proj;
  Weight out_proj;  // [H][value_dim]
  Buffer conv;      // [conv_dim][Kc]
  Buffer dt_bias;   // [nv]
  Buffer a_log;     // [nv]
  Buffer norm;      // [dv] plain weight (not 1+w)
};

struct MlpWeights {
  // [2I][H]: the checkpoint's gate_proj then up_proj, so one matmul makes a
  // row [gate I | up I] (what Swiglu reads).
  Weight gate_up;
  Weight down_proj;  // [H][I]
};

struct LayerWeights {
  LayerType type = LayerType::kLinearAttention;
  Buffer input_norm;              // [H] zero-centred
  Buffer post_attention_norm;     // [H] zero-centred
  AttentionWeights attn;          // when type == kFullAttention
  LinearAttentionWeights linear;  // when type == kLinearAttention
  MlpWeights mlp;
};

struct MtpWeights {
  Weight fc;                     // [H][2H]: input [norm_emb(e) | norm_hid(h)]
  Buffer pre_fc_norm_embedding;  // [H] zero-centred
  Buffer pre_fc_norm_hidden;     // [H] zero-centred
  Buffer norm;                   // [H] zero-centred, the head's final norm
  LayerWeights layer;            // one full-attention decoder layer
};

struct ModelWeights {
  Weight embed;                      // [V][H]
  Weight lm_head;                    // [V][H]; reads embed's data when tied
  Buffer final_norm;                 // [H] zero-centred
  std::vector<LayerWeights> layers;  // config.layer_types order
  bool has_mtp = false;
  MtpWeights mtp;        // valid when has_mtp
  Buffer rope_inv_freq;  // [rotary_dim/2]
};

// ---------------------------------------------------------------- caches

// Keys/values of one full-attention layer, post k_norm and RoPE.
// Row r holds position r. Rows >= the owner's length are scratch.
// Elements are the backend's KV cache type (Backend::KvCacheDType: fp32, or
// bf16 rounded to nearest even as the rows are written).
struct KvCache {
  Buffer k;  // [capacity][nkv·hd]
  Buffer v;  // [capacity][nkv·hd]
};

// State of one linear-attention layer.
struct LinearCache {
  // Elements are the backend's recurrent state type
  // (Backend::RecurrentStateDType: fp32, or bf16 rounded after every token;
  // kernels/gated_delta_rule.h); the conv state is fp32.
  Buffer recurrent;  // [nv][dk][dv]: S after the last committed token
  Buffer conv;       // [conv_dim][Kc−1]: last Kc−1 raw inputs, newest last
  // Verify captures: the state after each column of the last Verify.
  Buffer recurrent_columns;  // [max_verify_columns][nv][dk][dv]
  Buffer conv_columns;       // [max_verify_columns][conv_dim][Kc−1]
};

struct StateOptions {
  int capacity = 4096;  // rows the caches hold (trunk and MTP)
  // T limit of Verify. Not a draft depth bound: the worker's sessions set
  // it to their draft depth + 1 (kMaxDraftDepth, proto/api_limits.h, bounds
  // that); the default serves direct users of the model (tests, tools).
  int max_verify_columns = 16;
  // false: no draft state (no MTP KV, no per-column verify captures), as
  // after FreeDraftState: a session that only runs plain decode.
  bool draft_state = true;
  // Trunk KV in pages a later fork can share (Backend::AllocateShareable),
  // which costs more to allocate on CUDA than the pool's memory: asked for
  // where the history will fill a page (Model::WorthSharing).
  bool shareable = false;
  // Rows where later forks are expected to resume (the first prompt's end
  // and its prefix checkpoints): a shareable state's KV memory is laid out
  // so that a fork at one of them shares it in few pieces
  // (Backend::AllocateShareable's share points).
  std::vector<int> share_rows;
};

// Recorded steps (Backend::BeginRecording) by key (step kind, rows,
// attention max_position), and the keys that have run once op by op.
struct RecordedSteps {
  using Key = std::array<int, 3>;
  std::map<Key, std::unique_ptr<kernels::Backend::Recording>> graphs;
  std::set<Key> warm;
  void Clear() {
    graphs.clear();
    warm.clear();
  }
};

// One session's caches (create with Model::NewState). Invariant between calls:
// the trunk caches hold exactly rows [0, length) (attention KV rows, and the
// recurrent/conv state after row length−1); the MTP KV holds rows [0,
// mtp_length). While offloaded (Model::Offload) it holds no backend memory
// and every forward call on it fails with FAILED_PRECONDITION; length and
// mtp_length keep their values.
class ModelState {
 public:
  int capacity() const { return capacity_; }
  int max_verify_columns() const { return max_verify_columns_; }
  // Committed trunk rows (the next token's position).
  int length() const { return length_; }
  // MTP KV rows [0, mtp_length) are valid.
  int mtp_length() const { return mtp_length_; }
  // Columns of the last Verify not yet committed (0 = none pending).
  int verified_columns() const { return verified_columns_; }
  // The caches live in host memory (Model::Offload) until Model::Restore.
  bool offloaded() const { return offloaded_; }
  // The MTP KV and verify capture buffers exist (false after
  // Model::FreeDraftState: only Prefill/Decode/DecodeBatch remain).
  bool has_draft_state() const { return !draft_freed_; }
  // A recorded decode step (Model::set_use_graphs) failed for this session:
  // its steps run op by op until Model::Restore resumes it.
  bool graph_fallback() const { return graph_fallback_; }

 private:
  friend class Model;
  ModelState() = default;
  int capacity_ = 0;
  int max_verify_columns_ = 0;
  int length_ = 0;
  int mtp_length_ = 0;
  int verified_columns_ = 0;
  bool offloaded_ = false;
  bool draft_freed_ = false;
  bool graph_fallback_ = false;
  bool shareable_ = false;           // StateOptions::shareable
  std::vector<int> share_rows_;      // StateOptions::share_rows
  std::vector<KvCache> kv_;          // one per full-attention layer, in order
  std::vector<LinearCache> linear_;  // one per linear-attention layer
  KvCache mtp_kv_;                   // the MTP layer's cache (when has_mtp)
  // Recorded Verify steps: their kernels hold this session's state and
  // capture buffers, so they are dropped whenever those are freed or
  // replaced (Offload, Restore, FreeDraftState).
  RecordedSteps verify_steps_;
  // Page sharing with other states (Model::Fork, docs/DESIGN.md "Prefix
  // reuse"). Invariant: no pass writes a trunk KV row below
  // kv_shared_rows_, the rows whose bytes may be mapped by another state
  // (lent to a fork, or borrowed from the source); a call that moves the
  // length below it (Reset, RestoreCheckpoint, an in-place Restore) first
  // gives this state pages of its own there (Model::UnshareFrom). Mutable:
  // lending marks the source's memory, it changes none of its state.
  mutable int kv_shared_rows_ = 0;
  // Lives while this state's lent pages are still its own memory; a fork
  // watches it through `lender_` (StateBytes).
  mutable std::shared_ptr<const int> lent_;
  // The bytes of this state's KV buffers that its source's pages hold, not
  // counted as this state's while the source still holds them too.
  uint64_t borrowed_bytes_ = 0;
  std::weak_ptr<const int> lender_;
};

// A saved copy of a state's recurrent and conv state at `length` (the
// prompt-end checkpoint that "regenerate" rewinds to). Only the linear
// layers need copying: KV rows below `length` are never rewritten while the
// session lives, since every pass writes rows >= the committed length.
// While offloaded (Model::OffloadCheckpoint, with its session's state) the
// copies are in host memory and `recurrent`/`conv` are empty: it holds no
// backend memory until Model::ReloadCheckpoint.
struct TrunkCheckpoint {
  int length = 0;                 // committed trunk rows when saved
  int mtp_length = 0;             // valid MTP rows when saved
  std::vector<Buffer> recurrent;  // per linear layer [nv][dk][dv]
  std::vector<Buffer> conv;       // per linear layer [conv_dim][Kc−1]
  bool offloaded = false;
  // While offloaded: the recurrent states' bytes as stored, the conv's floats.
  std::vector<std::vector<uint8_t>> host_recurrent;
  std::vector<std::vector<float>> host_conv;

  // Backend bytes the copies hold (0 while offloaded).
  uint64_t bytes() const;
  // Host bytes the copies hold (0 unless offloaded).
  uint64_t host_bytes() const;
};

// Host copy of a session's live rows (Model::Offload), plain memory: what
// Model::Restore needs to rebuild the state. Shapes in the notation above;
// kv_dim = nkv·hd. KV rows are the cache's bytes as stored (fp32 or bf16
// elements, Model::kv_cache_dtype), and so are the recurrent states
// (Model::recurrent_state_dtype), so a restore is exact.
struct HostStateSnapshot {
  int length = 0;      // committed trunk rows
  int mtp_length = 0;  // valid MTP rows (0 without draft state)
  // Per full-attention layer, rows [0, length): [length][kv_dim].
  std::vector<std::vector<uint8_t>> k;
  std::vector<std::vector<uint8_t>> v;
  // Per linear layer: [nv][dk][dv] bytes as stored, and [conv_dim][Kc−1].
  std::vector<std::vector<uint8_t>> recurrent;
  std::vector<std::vector<float>> conv;
  std::vector<uint8_t> mtp_k;  // [mtp_length][kv_dim]
  std::vector<uint8_t> mtp_v;  // [mtp_length][kv_dim]

  // Host bytes held.
  uint64_t bytes() const;
};

// ---------------------------------------------------------------- results

// Host copies of a pass's outputs, row-major.
struct ForwardResult {
  int rows = 0;
  // Position of row 0 (rows follow on). −1 for DecodeBatch, whose row i is
  // session i's token at that session's own position.
  int first_position = 0;
  // A request, set before the call (Clear keeps it): false leaves `logits`
  // empty, saving the [rows][V] copy to the host (what greedy decoding
  // skips: it needs only argmax and finite). Model::CopyLogitsRow fetches
  // a row afterwards while the pass's logits are still in the workspace.
  bool want_logits = true;
  // A request for one-row passes through spec::ModelExecutor (Clear keeps
  // it): when set, row 0's token is drawn on the backend with this config
  // and uniform (Model::SampleRows) into `drawn`, unless the row is not
  // finite (then `drawn` stays -1).
  struct Draw {
    sampling::SamplingConfig config;
    float uniform = 0.0f;
  };
  std::optional<Draw> draw;
  int32_t drawn = -1;
  // A request (Clear keeps it): rows of this result whose token must come
  // from an allowed set (structured output). Row mask_rows[i] may take the
  // tokens whose bits are set in mask_words[i·W, (i+1)·W), W =
  // kernels::TokenMaskWords(V), bit b of word w allowing token 32·w + b.
  // The pass masks those rows on the backend right after its lm_head
  // (kernels/token_mask.h: the others -inf, in place), so `argmax` is the
  // allowed argmax, a draw from the pass's logits (SampleRows, `draw`)
  // picks an allowed token, and `logits`, when wanted, come back masked;
  // `finite` still describes the raw row. Only the constrained rows' words
  // travel to the backend, never their [V] logits to the host.
  std::vector<int32_t> mask_rows;
  std::vector<uint32_t> mask_words;
  std::vector<float> logits;    // [rows][V] (empty unless want_logits)
  std::vector<float> hidden;    // [rows][H]: final-norm hidden (lm_head input)
  std::vector<int32_t> argmax;  // [rows]: greedy token of each row
  std::vector<int32_t> finite;  // [rows]: 1 when every logit of the row is
                                // finite, 0 when one is NaN or ±inf

  // Empty, with row 0 at `position` (keeps the vectors' capacity).
  void Clear(int position) {
    rows = 0;
    first_position = position;
    drawn = -1;
    logits.clear();
    hidden.clear();
    argmax.clear();
    finite.clear();
  }
  bool AllFinite() const {
    for (int32_t f : finite) {
      if (f == 0) return false;
    }
    return true;
  }
};

struct PrefillOptions {
  // false: only the last row's outputs; true: every row's (costs one
  // lm_head matmul per row).
  bool all_rows = false;
  // When set, receives every row's final-norm hidden [T][H] without the
  // lm_head (what the MTP KV fill needs from a prompt).
  std::vector<float>* all_hidden = nullptr;
};

// ---------------------------------------------------------------- model

class Model {
 public:
  // Rows per decode, verify or MTP pass, and logits rows per pass.
  static constexpr int kMaxRows = 64;
  // Rows per prefill pass (Prefill, PrefillBatch): a long prompt runs in
  // chunks of this size, enough rows that every matmul's tiles fill the
  // GPU's SMs in whole waves (5,120 outputs are 40 tiles: at 1,024 rows a
  // second wave ran at a fifth full). The prefill ops are row-invariant, and
  // the chunked delta rule's bits depend only on chunks at absolute
  // positions, so any chunking cut at multiples of
  // kernels::kPrefillDeltaRuleChunk (PrefillPassRows) gives the same bits.
  static constexpr int kMaxPrefillRows = 4096;
  // Rows of the next pass of a prompt at `position` with `left` rows to go,
  // at most `max_rows` (a multiple of kernels::kPrefillDeltaRuleChunk): the
  // pass ends at such a multiple unless it ends the prompt.
  static int PrefillPassRows(int64_t position, int64_t left, int max_rows);

  // Opens `model_dir` (config.json + safetensors) and makes its weights
  // readable by `backend`, which must outlive the model.
  static absl::StatusOr<std::unique_ptr<Model>> Load(
      const std::string& model_dir, kernels::Backend* backend);
  static absl::StatusOr<std::unique_ptr<Model>> FromCheckpoint(
      std::unique_ptr<model_files::Checkpoint> checkpoint,
      kernels::Backend* backend);

  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const model_files::Checkpoint& checkpoint() const { return *checkpoint_; }
  kernels::Backend* backend() const { return backend_; }
  bool has_mtp() const { return weights_.has_mtp; }
  // Element type of the KV caches: the backend's (Backend::KvCacheDType),
  // fixed at load.
  kernels::DType kv_cache_dtype() const { return kv_dtype_; }
  // Bytes of one position's keys (or values) in one layer's cache.
  size_t kv_row_bytes() const;
  // Element type of the recurrent states: the backend's
  // (Backend::RecurrentStateDType), fixed at load.
  kernels::DType recurrent_state_dtype() const { return rec_dtype_; }
  // Bytes of one linear layer's recurrent state [nv][dk][dv].
  size_t recurrent_state_bytes() const;
  // Bytes of weights one decode step reads (trunk matrices + lm_head).
  uint64_t decode_weight_bytes() const;

  absl::StatusOr<std::unique_ptr<ModelState>> NewState(
      const StateOptions& options) const;
  // Empties the caches (length 0, zero state) for a new sequence. A freed
  // draft state (FreeDraftState) stays freed.
  absl::Status Reset(ModelState* state) const;

  // ---- Trunk.
  // Appends `tokens` at positions [length, length+T) and commits them.
  // OUT_OF_RANGE if they do not fit the capacity; INVALID_ARGUMENT for ids
  // outside the vocabulary; FAILED_PRECONDITION while a Verify is pending.
  absl::Status Prefill(ModelState* state, absl::Span<const int32_t> tokens,
                       const PrefillOptions& options, ForwardResult* out);
  // Prefill of one token; `out` gets its logits, hidden and argmax.
  absl::Status Decode(ModelState* state, int32_t token, ForwardResult* out);
  // Decode of tokens[i] on states[i] for B = states.size() <= kMaxRows
  // distinct sessions, each at its own length: the matmuls run once over
  // all B rows, attention / conv / the delta rule per session on its own
  // caches. `out` row i (rows = B, first_position = −1) and session i's
  // resulting caches are bit-identical to Decode(states[i], tokens[i])
  // alone. All-or-nothing checks before anything runs: INVALID_ARGUMENT
  // (sizes, duplicates, null, ids), FAILED_PRECONDITION (a pending Verify,
  // offloaded caches), OUT_OF_RANGE (a session at capacity).
  absl::Status DecodeBatch(absl::Span<ModelState* const> states,
                           absl::Span<const int32_t> tokens,
                           ForwardResult* out);
  // Runs T <= max_verify_columns tokens at [length, length+T) without
  // committing: KV rows are written, recurrent/conv states are captured
  // after every column; `out` gets every column's outputs. Column j is
  // bit-identical to decoding tokens[0..j] one by one.
  absl::Status Verify(ModelState* state, absl::Span<const int32_t> tokens,
                      ForwardResult* out);
  // Verify of columns[i] on states[i] for several distinct sessions in one
  // trunk pass (at most kMaxRows columns in all; each session's count within
  // its max_verify_columns): the matmuls and the lm_head run once over all
  // columns, attention / conv / the delta rule per session on its own
  // caches and captures. out[i] and session i's pending verify are
  // bit-identical to Verify(states[i], columns[i]) alone (row invariance);
  // each is then committed or discarded on its own. CopyLogitsRow and
  // SampleRows address the pass's rows in order: session i's column j is
  // row (columns of sessions before i) + j. All-or-nothing checks before
  // anything runs, with Verify's and DecodeBatch's codes.
  absl::Status VerifyBatch(absl::Span<ModelState* const> states,
                           absl::Span<const std::vector<int32_t>> columns,
                           absl::Span<ForwardResult* const> out);
  // Prefill of tokens[i] on states[i] for every session in one trunk pass,
  // at most kMaxRows rows in all: the matmuls and the lm_head run once over
  // all rows, the cache ops per session. out[i] gets session i's last row
  // (logits when want_logits, hidden, argmax) and all_hidden[i], when given
  // (the span may be empty, an entry null), every row's final-norm hidden:
  // both bit-identical to Prefill(states[i], tokens[i]) alone (row
  // invariance). SampleRows and CopyLogitsRow address the pass's rows in
  // order. All-or-nothing checks before anything runs, with Prefill's codes.
  absl::Status PrefillBatch(absl::Span<ModelState* const> states,
                            absl::Span<const absl::Span<const int32_t>> tokens,
                            absl::Span<std::vector<float>* const> all_hidden,
                            absl::Span<ForwardResult* const> out);
  // Keeps columns 0..column of the pending Verify: the recurrent and conv
  // states become column `column`'s, length += column+1 (the KV rows past
  // that are dropped). Ends the pending Verify.
  absl::Status CommitVerified(ModelState* state, int column);
  // Drops the pending Verify without committing any column.
  void DiscardVerified(ModelState* state) const;

  // Copies row `row` of the logits of the latest lm_head pass (the rows the
  // latest Decode, DecodeBatch, Verify or MtpDraft produced, counted from 0)
  // into `logits` ([V]). Valid until the next forward call on this model;
  // OUT_OF_RANGE for a row that pass did not produce.
  absl::Status CopyLogitsRow(int row, std::vector<float>* logits) const;
  // The token drawn from each row rows[i] of the same logits with configs[i]
  // at uniforms[i] (sampled, not greedy), on the backend
  // (kernels/sample_rows.h: the host filters' tokens, only the tokens copied
  // back). OUT_OF_RANGE as above; FAILED_PRECONDITION for non-finite logits.
  absl::Status SampleRows(absl::Span<const int32_t> rows,
                          absl::Span<const sampling::SamplingConfig> configs,
                          absl::Span<const float> uniforms,
                          std::vector<int32_t>* tokens);
  // The token drawn from a row of logits held on the host (a session's
  // stored last logits: the workspace's may belong to another session by
  // now), on the backend like SampleRows: the row is copied there first.
  absl::StatusOr<int32_t> SampleHostLogits(
      absl::Span<const float> logits, const sampling::SamplingConfig& config,
      float uniform);

  // ---- Recorded steps (a backend that CanRecord: CUDA graphs on the GPU,
  // op closures on the CPU).
  // Decode, DecodeBatch and one-row MtpForward/MtpDraft (the draft chain)
  // record their device work once per (step kind, number of sessions,
  // position bucket of kGraphPositionBucket rows), Verify once per
  // (session, columns, bucket), and replay it afterwards: the same ops on
  // the same buffers, so results are bit-identical to running them one by
  // one, minus the per-op launch cost. Step inputs (ids, per-session
  // positions and cache pointers) are copied in before each replay. A key's
  // first step runs op by op. If recording fails, the step runs op by op
  // and its sessions stay on that path until Restore
  // (ModelState::graph_fallback). On by default (a serving CPU backend does
  // not record: CpuBackendOptions.recording).
  static constexpr int kGraphPositionBucket = 256;
  void set_use_graphs(bool on) { use_graphs_ = on; }
  bool use_graphs() const { return use_graphs_; }
  // Forgets the recorded decode and batch steps (benchmarks that change what
  // a step enqueues); the next step of each key runs op by op, then records.
  void DropRecordedSteps() { steps_.Clear(); }
  struct GraphStats {
    int64_t eager = 0;     // graphable steps run op by op (first use of a key)
    int64_t recorded = 0;  // recordings made
    int64_t replayed = 0;  // steps replayed (including right after recording)
    int64_t failed = 0;    // recordings that failed (sessions fell back)
  };
  const GraphStats& graph_stats() const { return graph_stats_; }

  // Copies the committed recurrent/conv state (no Verify may be pending).
  absl::StatusOr<std::unique_ptr<TrunkCheckpoint>> SaveCheckpoint(
      const ModelState& state) const;
  // Returns `state` to `checkpoint`: length and recurrent/conv state as
  // saved, MTP rows cut to at most the saved count, any pending Verify
  // dropped. The caller guarantees the KV rows below the saved length are
  // still those of the saved history (true unless they were evicted).
  absl::Status RestoreCheckpoint(ModelState* state,
                                 const TrunkCheckpoint& checkpoint) const;

  // Makes `dst` an exact copy of `src`'s state at one of its reusable
  // positions (worker/model/fork.cc): at `src`'s committed end when `at` is
  // null, else at the checkpoint `at` (saved from `src`, resident). Copies
  // the attention KV rows [0, pos), the recurrent and conv state at pos and,
  // when both states hold draft state, the MTP KV rows valid at pos. `dst`
  // keeps its own capacity and options and behaves bit-identically to `src`
  // returned to pos. Requires `dst` empty (length 0) and resident, `src`
  // resident with no pending Verify; OUT_OF_RANGE when pos exceeds `dst`'s
  // capacity, INVALID_ARGUMENT when `at` does not fit `src`.
  absl::Status ForkState(const ModelState& src, const TrunkCheckpoint* at,
                         ModelState* dst) const;
  // A new state with `options` holding what ForkState would copy into it,
  // with the attention KV rows below pos in the source's own pages where
  // the backend can share them (Backend::AllocateSharing: whole pages; the
  // rest is copied). Sharing is copy-on-write: either state moving its
  // length below the shared rows first takes pages of its own. The MTP KV
  // rows are copied (a draft chain rewrites them below mtp_length). Same
  // checks and codes as ForkState.
  absl::StatusOr<std::unique_ptr<ModelState>> Fork(
      const StateOptions& options, const ModelState& src,
      const TrunkCheckpoint* at) const;

  // Whether a history of `rows` rows fills a page the backend can share
  // (Backend::SharingPageBytes; false where it shares nothing).
  bool WorthSharing(int rows) const;

  // Host copy of linear-attention layer `index`'s state (index counts the
  // linear layers only): the committed state when column < 0, else the
  // pending Verify's capture after `column`. The recurrent state comes
  // widened to fp32 (exact for a bf16 state). For tests and cross-backend
  // checks.
  absl::Status ReadLinearState(const ModelState& state, int index, int column,
                               std::vector<float>* recurrent,
                               std::vector<float>* conv) const;

  // ---- MTP head (requires has_mtp()).
  // Runs MTP rows p = first_row .. first_row+n−1: row p reads the trunk
  // hidden h_p (hiddens[i] for p = first_row+i, host [n][H]) and the next
  // token t_{p+1} (next_tokens[i]) at RoPE position p, attending MTP rows
  // 0..p. Writes MTP KV rows [first_row, first_row+n) and sets
  // mtp_length = first_row+n. Requires first_row <= mtp_length.
  // `out` (nullable) gets logits (predicting t_{p+2}), the head's normed
  // output hidden h' and argmax for every row.
  absl::Status MtpForward(ModelState* state, absl::Span<const float> hiddens,
                          absl::Span<const int32_t> next_tokens, int first_row,
                          ForwardResult* out);
  // One draft step (MtpForward with n = 1): chain by passing back
  // out->hidden, the drafted token and position + 1.
  absl::Status MtpDraft(ModelState* state, absl::Span<const float> hidden,
                        int32_t token, int position, ForwardResult* out);
  // One draft step of each of several distinct sessions in one MTP pass:
  // session i reads hiddens[i] ([H]) and tokens[i] at positions[i], as
  // MtpDraft(states[i], hiddens[i], tokens[i], positions[i]) would, bit for
  // bit (row invariance), the fc, the layer's matmuls and the lm_head run
  // once over all rows; out[i] gets row i (CopyLogitsRow / SampleRows: row i
  // of the pass). All-or-nothing checks, with MtpForward's codes.
  absl::Status MtpDraftBatch(absl::Span<ModelState* const> states,
                             absl::Span<const std::vector<float>> hiddens,
                             absl::Span<const int32_t> tokens,
                             absl::Span<const int> positions,
                             absl::Span<ForwardResult* const> out);
  // MTP rows of several distinct sessions in one pass: session i's rows are
  // rows[i].first_row .. first_row+n−1 (n = rows[i].tokens.size() >= 1),
  // written bit for bit as MtpForward(states[i], rows[i].hiddens,
  // rows[i].tokens, rows[i].first_row) would write them, at most kMaxRows
  // rows in all. out[i] (nullable) gets session i's last row (logits: row i
  // of the pass for CopyLogitsRow / SampleRows, hidden h', argmax), as
  // MtpForward gives it. A speculative round's first draft step and the MTP
  // rows its session owes run this way as one pass. All-or-nothing checks,
  // with MtpForward's codes.
  struct MtpRows {
    int first_row = 0;
    absl::Span<const float> hiddens;   // [n][H]
    absl::Span<const int32_t> tokens;  // [n]
  };
  absl::Status MtpBatch(absl::Span<ModelState* const> states,
                        absl::Span<const MtpRows> rows,
                        absl::Span<ForwardResult* const> out);
  // Drops MTP rows >= rows (mtp_length = min(mtp_length, rows)), e.g. the
  // chain's draft rows before refilling them from true trunk hiddens.
  absl::Status TruncateMtp(ModelState* state, int rows) const;

  // ---- Memory (the worker's session pool).
  // Backend bytes `state` holds: KV, recurrent/conv states, verify
  // captures, MTP KV. 0 while offloaded.
  uint64_t StateBytes(const ModelState& state) const;
  // Copies the live rows (trunk KV [0, length), recurrent + conv states,
  // MTP KV [0, mtp_length)) to host memory and frees every backend buffer
  // of `state`. FAILED_PRECONDITION when already offloaded or a Verify is
  // pending. On error the state is unchanged.
  absl::StatusOr<std::unique_ptr<HostStateSnapshot>> Offload(
      ModelState* state) const;
  // Makes `state` hold `snap`: reallocates the buffers of an offloaded state
  // (same capacity and options; a resident one with no pending Verify is
  // overwritten in place) and copies the rows back. Afterwards the state
  // behaves bit-identically to one never offloaded. INVALID_ARGUMENT if the
  // snapshot's shapes do not fit; on error an offloaded state stays
  // offloaded. MTP rows are dropped when the state has no draft state.
  absl::Status Restore(ModelState* state, const HostStateSnapshot& snap) const;
  // Moves a checkpoint's copies to host memory and frees their backend
  // memory (a session's checkpoint goes with its offloaded state).
  // FAILED_PRECONDITION when already offloaded; on error it is unchanged.
  absl::Status OffloadCheckpoint(TrunkCheckpoint* checkpoint) const;
  // Back into backend memory, bit-identical; a resident checkpoint is left
  // as it is. On error it stays offloaded.
  absl::Status ReloadCheckpoint(TrunkCheckpoint* checkpoint) const;
  // One-way release of the MTP KV and verify capture buffers (demotion to
  // batched decode): afterwards Verify, MtpForward and MtpDraft fail with
  // FAILED_PRECONDITION, mtp_length is 0 and StateBytes drops. Idempotent;
  // also allowed while offloaded (Restore then skips those buffers).
  // FAILED_PRECONDITION while a Verify is pending.
  absl::Status FreeDraftState(ModelState* state) const;

 private:
  // kCommit: the exact ops, states updated in place (decode). kVerify: the
  // exact ops, states to the capture slots. kPrefill: as kCommit but on the
  // backend's prefill forms (kernels/backend.h), per slice (never as a
  // session batch, which would run decode's ops for one-row slices).
  enum class Mode { kCommit, kVerify, kPrefill };
  struct Workspace;
  // Workspace rows [row0, row0+rows) of a pass belong to one session and sit
  // at positions [start, start+rows) of its caches.
  struct Slice {
    int row0 = 0;
    int rows = 0;
    int start = 0;
  };

  // Backend arrays of a session batch (every slice one row, B > 1) for this
  // layer: the cache ops then run once over all rows (kernels' session-batch
  // mode) instead of once per slice.
  struct SessionBatch {
    int sessions = 0;                    // B
    const uint64_t* table = nullptr;     // the uploaded table (workspace.h)
    const int32_t* positions = nullptr;  // [B]
    int max_position = 0;
    void* const* k = nullptr;  // [B] this layer's K caches (full attention)
    void* const* v = nullptr;
    float* const* conv = nullptr;      // [B] conv states (linear attention)
    void* const* recurrent = nullptr;  // [B] recurrent states
  };

  Model() = default;
  absl::Status LoadWeights();
  absl::Status EnsureWorkspace();
  absl::Status CheckTokens(absl::Span<const int32_t> tokens) const;
  // FAILED_PRECONDITION when `state`'s caches are offloaded.
  static absl::Status CheckResident(const ModelState& state);
  // The checks every batched pass makes of its session i ("`what`: session
  // i ..."): INVALID_ARGUMENT when null or listed before, FAILED_PRECONDITION
  // when offloaded or (with `drafts`) its draft state was freed.
  static absl::Status CheckBatchMember(absl::Span<ModelState* const> states,
                                       int i, const char* what, bool drafts);
  // Allocates every cache buffer of an empty `state` (per its capacity,
  // max_verify_columns and draft_freed_); zero-filled.
  // With `share_from`, its trunk KV pages holding rows [0, share_rows) become
  // the state's own rows there (Fork); sets borrowed_bytes_ and
  // kv_shared_rows_ on both.
  absl::Status AllocateCaches(ModelState* state,
                              const ModelState* share_from = nullptr,
                              int share_rows = 0) const;
  // ForkState's checks: the position a fork of `src` at `at` holds, or the
  // error, for a target of `capacity` rows.
  static absl::StatusOr<int> ForkPosition(const ModelState& src,
                                          const TrunkCheckpoint* at,
                                          int capacity);
  // Copies what a fork at pos holds into the empty `dst`, trunk KV bytes
  // from `kv_from_bytes` on (those below are shared pages).
  absl::Status CopyFork(const ModelState& src, const TrunkCheckpoint* at,
                        int pos, size_t kv_from_bytes, ModelState* dst) const;
  // Makes every trunk KV row >= `row` of `state` its own memory before a
  // write there (see ModelState::kv_shared_rows_); a no-op when row >=
  // kv_shared_rows_.
  absl::Status UnshareFrom(ModelState* state, int row) const;
  // Trunk pass over T <= kMaxRows tokens (kMaxPrefillRows for kPrefill):
  // slices[i] (covering the rows in
  // order) runs on states[i] at slices[i].start. Leaves the final-norm
  // hidden of every row in the workspace. kVerify takes one slice.
  absl::Status RunTrunk(absl::Span<ModelState* const> states,
                        absl::Span<const Slice> slices,
                        absl::Span<const int32_t> tokens, Mode mode);
  // Copies rows [row0, row0+n) of the workspace's hidden out, with logits
  // and argmax, appending to `out`.
  absl::Status EmitRows(int row0, int n, ForwardResult* out);
  // The blocks batch their matmuls over all `rows`; the cache ops run per
  // slice on kvs[i] / caches[i], or once over a session batch when `batch`
  // is given (then kvs / caches are unused).
  absl::Status FullAttentionBlock(const LayerWeights& w,
                                  absl::Span<KvCache* const> kvs,
                                  absl::Span<const Slice> slices, Mode mode,
                                  int rows, const SessionBatch* batch);
  absl::Status LinearAttentionBlock(const LayerWeights& w,
                                    absl::Span<LinearCache* const> caches,
                                    absl::Span<const Slice> slices, Mode mode,
                                    int rows, const SessionBatch* batch);
  absl::Status MlpBlock(const LayerWeights& w, Mode mode, int rows);
  // Copies a step's token ids into ws.ids (outside any recording).
  absl::Status UploadIds(absl::Span<const int32_t> tokens);
  // Embeds the first `rows` ids of ws.ids into rows 0.. of ws.h.
  absl::Status EmbedUploaded(int rows);
  // Uploads the session-batch table (workspace.h) for one row per state
  // at positions[i], and fills `batch` (attention sized for max_position,
  // which may exceed every row's position).
  absl::Status UploadSessionTable(absl::Span<ModelState* const> states,
                                  absl::Span<const int> positions,
                                  int max_position, SessionBatch* batch);
  // The trunk's device work once tokens (ws.ids) and any session table are
  // uploaded: embedding, the layers, the final norm (into ws.hidden). With
  // mode kVerify, `batch` (one row per column of the one session) serves the
  // attention layers only.
  absl::Status TrunkOps(absl::Span<ModelState* const> states,
                        absl::Span<const Slice> slices, int rows, Mode mode,
                        const SessionBatch* batch);
  // lm_head and argmax of workspace rows [row0, row0+n) of ws.hidden, or
  // of n <= kMaxRows rows at `hidden` (device work), into rows 0..n of the
  // logits and argmax.
  absl::Status LmHead(int row0, int n);
  absl::Status LmHeadOf(const float* hidden, int n);
  // Appends rows [row0, row0+n)'s logits, hidden and argmax (LmHead's
  // outputs) to `out`, its constrained rows masked first.
  absl::Status CopyRowsOut(int row0, int n, ForwardResult* out);
  // The constrained rows of a pass (ForwardResult::mask_rows), gathered
  // from its results and masked in one MaskTokens call, after the lm_head
  // and before anything reads its argmax or logits.
  struct PassMasks {
    std::vector<int32_t> rows;  // logits rows
    std::vector<uint32_t> words;
  };
  // Adds r's mask rows in [first, first + n); its row j is logits row
  // logits_row0 + j - first. INVALID_ARGUMENT for a row outside the
  // result or words of the wrong size.
  absl::Status GatherMasks(const ForwardResult& r, int first, int n,
                           int logits_row0, PassMasks* masks) const;
  absl::Status ApplyMasks(const PassMasks& masks);
  // One committed token for each state (checked by the caller): recorded
  // and replayed when graphs apply (decode_step.cc), else RunTrunk.
  absl::Status DecodeStep(absl::Span<ModelState* const> states,
                          absl::Span<const int32_t> tokens, ForwardResult* out);
  // Recorded steps: key = (kind, sessions, attention max_position).
  enum class StepKind { kDecode, kMtpDraft, kVerify };
  using GraphKey = RecordedSteps::Key;
  // True when a step on `states` may be recorded (use_graphs_, a backend
  // that records, no session on the op-by-op fallback).
  bool GraphsApply(absl::Span<ModelState* const> states) const;
  // The last position of `position`'s bucket: attention in a recorded step
  // is launched for it, so the recording serves the whole bucket.
  static int GraphBucketLast(int position);
  // Runs `device_ops` (device work only, its inputs already uploaded) as
  // the recording of `key`: op by op on the key's first use, recorded on
  // its second and replayed from then on. A failed recording runs the ops
  // op by op and puts `states` on the fallback (ModelState::graph_fallback).
  absl::Status RunRecorded(RecordedSteps* steps, const GraphKey& key,
                           absl::Span<ModelState* const> states,
                           const std::function<absl::Status()>& device_ops);
  // Verify's pass when graphs apply: the attention layers take positions
  // and caches from a table (one row per column), so one recording per
  // (session, T, bucket) serves every round (decode_step.cc).
  absl::Status VerifyRecorded(ModelState* state,
                              absl::Span<const int32_t> tokens,
                              ForwardResult* out);
  // MtpForward of one row (a draft step) when graphs apply (mtp.cc).
  absl::Status MtpRowRecorded(ModelState* state, absl::Span<const float> hidden,
                              int32_t token, int row, ForwardResult* out);
  // The MTP head's device work for `rows` rows at MTP rows [start, ...),
  // inputs (ws.mtp_in, ws.ids, the table when `batch`) uploaded.
  absl::Status MtpOps(ModelState* state, int rows, int start,
                      const SessionBatch* batch);
  // Prefill's argument checks.
  absl::Status CheckPrefill(const ModelState& state,
                            absl::Span<const int32_t> tokens) const;

  ModelConfig config_;
  kernels::DType kv_dtype_ = kernels::DType::kF32;
  kernels::DType rec_dtype_ = kernels::DType::kF32;
  std::unique_ptr<model_files::Checkpoint> checkpoint_;
  kernels::Backend* backend_ = nullptr;
  ModelWeights weights_;
  std::unique_ptr<Workspace> ws_;
  bool use_graphs_ = true;
  GraphStats graph_stats_;
  int lm_head_rows_ = 0;  // logits rows of the latest pass (CopyLogitsRow)
  // SampleRows over rows of x ([.][V] floats in backend memory).
  absl::Status SampleRowsOf(const float* x, absl::Span<const int32_t> rows,
                            absl::Span<const sampling::SamplingConfig> configs,
                            absl::Span<const float> uniforms,
                            std::vector<int32_t>* tokens);

  kernels::Buffer host_logits_row_;  // [V] floats (SampleHostLogits)
  // Decode and draft recordings hold only workspace addresses (valid for
  // the model's lifetime); a key's first use runs op by op (lazy
  // allocation cannot be recorded).
  RecordedSteps steps_;  // decode and draft steps (any session)
};

}  // namespace specserve::model

#endif  // SPECSERVE_WORKER_MODEL_MODEL_H_
