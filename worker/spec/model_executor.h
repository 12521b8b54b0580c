// Serializes a worker's use of its one Model (forward calls share the model's
// workspace and backend) and batches concurrent work of different sessions:
// plain-decode steps into one DecodeBatch pass, prompt chunks into one
// PrefillBatch pass, and tasks a client runs for many sessions at once
// (Together: the spec engine's speculative rounds, worker/spec/round_group.cc).
//
// Batching is by combining (Combine): a caller queues its step; whoever
// finds no pass of its kind being led becomes the leader, takes the model,
// then the queue (so steps queued while it waited join, up to kMaxBatch
// rows), runs it as one pass and hands each caller its result. The batched
// passes are bit-identical per session to the pass alone (row-invariant
// kernels), so a session's output never depends on who it was batched with.
//
// Gathering: a session streaming a burst registers as a LoopMember. A leader
// that holds the model waits, briefly, until every member is blocked on the
// executor (queued for a pass, or waiting for the model) before it takes the
// queue. Without it, sessions that stream together split into alternating
// partial batches: the members released by one pass are still emitting
// their tokens when the next pass starts without them.
#ifndef SPECSERVE_WORKER_SPEC_MODEL_EXECUTOR_H_
#define SPECSERVE_WORKER_SPEC_MODEL_EXECUTOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/model/model.h"
#include "worker/spec/live_step_costs.h"

namespace specserve::spec {

// How long a ModelExecutor's leader waits for members still emitting (see
// Gathering): `fraction_of_pass` of the last pass, at most `max_wait`. A
// straggler costs the batch at most that; a member left out loses a pass.
struct GatherOptions {
  absl::Duration max_wait = absl::Milliseconds(2);
  double fraction_of_pass = 0.25;
};

class ModelExecutor {
 public:
  static constexpr int kMaxBatch = model::Model::kMaxRows;

  explicit ModelExecutor(model::Model* model, GatherOptions gather = {})
      : model_(model), gather_(gather) {}

  model::Model* model() const { return model_; }

  // Where decode passes and speculative rounds report what they cost (null:
  // nowhere). Set before the first forward call; not owned.
  void set_live_costs(LiveStepCosts* costs) { live_costs_ = costs; }
  LiveStepCosts* live_costs() const { return live_costs_; }

  // Runs `fn` with exclusive use of the model. Combined like the passes:
  // the functions queued while the model was busy (admissions, checkpoints,
  // accept steps) run back to back under one hold, on the leader's thread,
  // so `fn` must not rely on running on the caller's thread (it may use
  // what the caller's locks guard: the caller waits, holding them). No
  // gathering: these do not wait for streaming members.
  absl::Status Exclusive(const std::function<absl::Status()>& fn);

  // Exclusive, but first every streaming member gets its next pass: waits
  // (at most the gather bound) for the members to block, then until the
  // passes queued by then have run. A long prefill runs as a series of
  // these, so sessions streaming meanwhile step between its chunks.
  absl::Status Interleaved(const std::function<absl::Status()>& fn);

  // Marks the calling thread's session as streaming (see Gathering above)
  // for the member's lifetime. Construct it on the thread that runs the
  // session's burst: that thread's executor calls count the member as
  // blocked. Not nestable per executor (a nested one counts nothing).
  class LoopMember {
   public:
    explicit LoopMember(ModelExecutor* executor);
    ~LoopMember();
    LoopMember(const LoopMember&) = delete;
    LoopMember& operator=(const LoopMember&) = delete;

   private:
    ModelExecutor* const executor_;
    bool counted_ = false;
  };

  // One plain decode step of `state`, batched with concurrent callers. With
  // out->draw set, the step's token is also drawn on the backend, in one
  // SampleRows call for the whole batch (out->drawn).
  absl::Status Decode(model::ModelState* state, int32_t token,
                      model::ForwardResult* out);

  // Work a client runs for several sessions at once with the model held
  // (the spec engine's speculative rounds: their draft steps, verifies and
  // accepts as shared passes). A caller queues `task`; the leader, once it
  // holds the model and has gathered the streaming members (as for the
  // passes), takes the queued tasks while their rows fit in Model::kMaxRows
  // and calls the first one's runner on them. Every task queued on one
  // executor must carry the same runner. The runner sets each task's status.
  struct GroupTask {
    using Runner = std::function<void(absl::Span<GroupTask* const>)>;
    const Runner* run = nullptr;  // set by Together
    int rows = 1;                 // what the task takes of a pass
    absl::Status status;
    bool done = false;    // combining: the group that carried it has run
    bool member = false;  // queued by a LoopMember's thread
  };
  void Together(GroupTask* task, const GroupTask::Runner& run);

  // Rows a prompt chunk should take now: a whole prefill pass
  // (Model::kMaxPrefillRows) while no session streams, else
  // kInterleavedPrefillRows, so a streaming session waits about one pass of
  // the weights per chunk. Chunking never changes a prompt's bits (the
  // prefill ops are row-invariant), so the choice is free to follow load.
  static constexpr int kInterleavedPrefillRows = 128;
  int PrefillChunkRows() const;

  // One prompt chunk of `state` (at most Model::kMaxPrefillRows tokens;
  // Prefill without all_rows), batched with concurrent callers' chunks into one
  // PrefillBatch pass, once every streaming member has had its next pass
  // (as Interleaved). `out` gets the last row, `all_hidden` (optional)
  // every row's final-norm hidden.
  absl::Status Prefill(model::ModelState* state,
                       absl::Span<const int32_t> tokens,
                       std::vector<float>* all_hidden,
                       model::ForwardResult* out);

  struct Stats {
    uint64_t batches = 0;          // DecodeBatch passes run
    uint64_t steps = 0;            // decode steps they carried
    uint64_t groups = 0;           // Together groups run
    uint64_t grouped = 0;          // tasks they carried
    uint64_t prefill_passes = 0;   // Prefill / PrefillBatch passes run
    uint64_t prefill_chunks = 0;   // prompt chunks they carried
    uint64_t exclusive = 0;        // Exclusive functions run
    uint64_t exclusive_holds = 0;  // model holds they ran in
    uint64_t gather_timeouts = 0;  // passes that started without a member
  };
  Stats stats() const;

 private:
  struct Step {
    model::ModelState* state;
    int32_t token;
    model::ForwardResult* out;
    absl::Status status;
    bool done = false;
    bool member = false;  // queued by a LoopMember's thread
  };

  // Runs `batch` (at most kMaxBatch steps) as one DecodeBatch pass, each
  // step's draw and logits row; sets each step's status.
  void RunDecodes(const std::vector<Step*>& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(model_mu_);
  // The draws the steps ask for, over rows[i] of the pass just run (whose
  // outputs `pass` holds).
  absl::Status DrawRows(const std::vector<Step*>& steps,
                        const model::ForwardResult& pass,
                        const std::vector<int32_t>& rows)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(model_mu_);

  // Runs `batch` (tasks of one runner) with the model held.
  void RunGroup(const std::vector<GroupTask*>& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(model_mu_);

  struct PrefillStep {
    model::ModelState* state;
    absl::Span<const int32_t> tokens;
    std::vector<float>* all_hidden;
    model::ForwardResult* out;
    absl::Status status;
    bool done = false;
    bool member = false;
  };
  void RunPrefills(const std::vector<PrefillStep*>& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(model_mu_);
  struct ExclusiveStep {
    const std::function<absl::Status()>* fn;
    absl::Status status;
    bool done = false;
    bool member = false;
  };
  void RunExclusives(const std::vector<ExclusiveStep*>& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(model_mu_);

  // Combining (the scheme of Decode): a caller queues its step; one that
  // finds no pass being led leads one. The leader takes the queue once the
  // model is held, so steps queued while it waited for the model (other
  // sessions drafting or decoding) join: in order, while their rows fit in
  // Model::kMaxRows. Returns once a pass carried `mine`.
  template <typename S>
  struct Combiner {
    explicit Combiner(const char* name, bool gathers = true,
                      int max_rows = model::Model::kMaxRows)
        : name(name), gathers(gathers), max_rows(max_rows) {}
    // What its passes are called in the pass timeline (GLOG_v=2).
    const char* const name;
    // Whether a leader waits for streaming members (AwaitMembersLocked)
    // and its pass sets the gather bound.
    const bool gathers;
    // Rows one pass may take.
    const int max_rows;
    std::deque<S*> queue;
    bool leader_active = false;
  };
  template <typename S, typename RowsOf, typename Run>
  void Combine(Combiner<S>* c, S* mine, RowsOf rows_of, Run run,
               uint64_t* passes, uint64_t* carried);

  // Whether the calling thread holds a LoopMember of this executor.
  bool CallerIsMember() const;
  // Waits (queue_mu_ held) until every member is blocked on the executor or
  // `full()` holds (the pass can grow no more), at most the gather bound.
  template <typename Full>
  void AwaitMembersLocked(Full full) ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_);
  // Waits (queue_mu_ held) for every streaming member to block (at most the
  // gather bound), then until the passes queued by then have run.
  void YieldToStreamingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_);

  model::Model* const model_;
  const GatherOptions gather_;
  LiveStepCosts* live_costs_ = nullptr;
  // Held for every forward call.
  absl::Mutex model_mu_;

  mutable absl::Mutex queue_mu_;
  Combiner<Step> decodes_ ABSL_GUARDED_BY(queue_mu_){"decode"};
  Combiner<GroupTask> groups_ ABSL_GUARDED_BY(queue_mu_){"group"};
  Combiner<PrefillStep> prefills_ ABSL_GUARDED_BY(queue_mu_){
      "prefill", /*gathers=*/true, model::Model::kMaxPrefillRows};
  Combiner<ExclusiveStep> exclusives_ ABSL_GUARDED_BY(queue_mu_){
      "exclusive", /*gathers=*/false};
  Stats stats_ ABSL_GUARDED_BY(queue_mu_);
  // LoopMembers alive, and how many of them are blocked on the executor:
  // queued in a combiner with their step not yet run, or waiting for the
  // model in Exclusive.
  int members_ ABSL_GUARDED_BY(queue_mu_) = 0;
  int blocked_members_ ABSL_GUARDED_BY(queue_mu_) = 0;
  absl::Duration last_pass_ ABSL_GUARDED_BY(queue_mu_);
};

}  // namespace specserve::spec

#endif  // SPECSERVE_WORKER_SPEC_MODEL_EXECUTOR_H_
