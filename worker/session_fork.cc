#include "worker/session_fork.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "kernels/sampling/sampling.h"
#include "telemetry/status_macros.h"
#include "worker/spec/spec_engine.h"

namespace specserve::worker {

absl::StatusOr<std::unique_ptr<spec::SpecSession>> ForkSession(
    spec::ModelExecutor* executor, const spec::SpecSession& src,
    const std::string& id, int capacity, absl::Span<const uint32_t> prefix,
    bool speculative) {
  const model::Model* model = executor->model();
  const int pos = static_cast<int>(prefix.size());
  if (pos == 0) {
    return absl::InvalidArgumentError(
        "fork: empty prefix (admit the session instead)");
  }
  if (pos > capacity) {
    return absl::OutOfRangeError(
        absl::StrCat("fork: a prefix of ", pos,
                     " tokens exceeds the capacity of ", capacity, " rows"));
  }
  if (src.has_pending()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fork: session ", src.id(), " carries a pending token (not parked)"));
  }
  if (pos > src.committed_len() ||
      !std::equal(
          prefix.begin(), prefix.end(), src.committed.begin(),
          [](uint32_t a, int32_t b) { return static_cast<int32_t>(a) == b; })) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fork: session ", src.id(), " does not hold that prefix here"));
  }
  // Where the state at pos lives: the live caches, or the checkpoint.
  const spec::TurnCheckpoint* cp =
      const_cast<spec::SpecSession&>(src).checkpoint();
  const model::TrunkCheckpoint* at = nullptr;
  const std::vector<float>* hidden = nullptr;
  const std::vector<float>* logits = nullptr;
  if (pos == src.committed_len()) {
    hidden = &const_cast<spec::SpecSession&>(src).last_hidden();
    logits = &const_cast<spec::SpecSession&>(src).last_logits();
  } else if (cp != nullptr && cp->pos == pos && src.rewind_is_resident()) {
    at = cp->trunk.get();
    hidden = &cp->last_hidden;
    logits = &cp->last_logits;
  } else if (const spec::TurnCheckpoint* pc = src.PrefixCheckpointAt(pos)) {
    at = pc->trunk.get();
    hidden = &pc->last_hidden;
    logits = &pc->last_logits;
  } else {
    return absl::FailedPreconditionError(
        absl::StrCat("fork: position ", pos,
                     " is neither a checkpoint nor the committed end of "
                     "session ",
                     src.id()));
  }
  const int V = model->config().vocab_size;
  if (static_cast<int>(logits->size()) != V) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fork: session ", src.id(), " holds no logits at position ", pos));
  }
  const bool drafts = speculative && model->has_mtp();
  if (drafts && !src.caches()->has_draft_state()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fork: session ", src.id(), " holds no draft state to copy"));
  }
  model::StateOptions options;
  options.capacity = capacity;
  options.max_verify_columns = drafts ? kMaxDraftDepth + 1 : 1;
  options.draft_state = drafts;
  std::unique_ptr<model::ModelState> caches;
  auto checkpoint = std::make_unique<spec::TurnCheckpoint>();
  // Where a fork's time goes (GLOG_v=1): waiting for the model, then the
  // fork (allocation, page sharing, copies) and the checkpoint.
  const absl::Time asked = absl::Now();
  absl::Time held, forked;
  SS_RETURN_IF_ERROR(executor->Exclusive([&]() -> absl::Status {
    held = absl::Now();
    // The prefix's attention rows are the source's pages where the backend
    // shares memory (Model::Fork); the rest is allocated and copied.
    SS_ASSIGN_OR_RETURN(caches, model->Fork(options, *src.caches(), at));
    forked = absl::Now();
    SS_ASSIGN_OR_RETURN(checkpoint->trunk, model->SaveCheckpoint(*caches));
    return absl::OkStatus();
  }));
  VLOG(1) << "fork " << id << " of " << src.id() << " at " << pos << ": waited "
          << absl::FormatDuration(held - asked) << ", forked "
          << absl::FormatDuration(forked - held) << " ("
          << (model->StateBytes(*caches) >> 20)
          << " MiB of its own), checkpoint "
          << absl::FormatDuration(absl::Now() - forked);
  auto s = std::make_unique<spec::SpecSession>(id, std::move(caches), drafts);
  s->committed.assign(prefix.begin(), prefix.end());
  s->last_hidden() = *hidden;
  s->last_logits() = *logits;
  // The greedy token after row pos-1, as the source has it (Rewind's rule
  // at the checkpoint; the tie rule matches the kernels').
  s->next_pred =
      at == nullptr && src.next_pred
          ? *src.next_pred
          : static_cast<int32_t>(sampling::ArgmaxFirst(logits->data(), V));
  checkpoint->pos = pos;
  checkpoint->last_hidden = *hidden;
  checkpoint->last_logits = *logits;
  s->set_checkpoint(std::move(checkpoint));
  s->CheckInvariants();
  return s;
}

}  // namespace specserve::worker
