#include "worker/spec/spec_session.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "glog/logging.h"

namespace specserve::spec {

SpecSession::SpecSession(std::string id,
                         std::unique_ptr<model::ModelState> caches,
                         bool has_mtp)
    : id_(std::move(id)), caches_(std::move(caches)), has_mtp_(has_mtp) {}

std::optional<int> SpecSession::rewind_pos() const {
  if (checkpoint_ == nullptr) return std::nullopt;
  return checkpoint_->pos;
}

bool SpecSession::rewind_is_resident() const {
  // The checkpoint keeps its own copies of the recurrent and conv state; the
  // attention rows it needs ([0, pos)) stay in the caches as long as the
  // session is resident and nothing truncated below pos.
  return checkpoint_ != nullptr && caches_ != nullptr &&
         checkpoint_->pos <= committed_len();
}

void SpecSession::AddPrefixCheckpoints(
    std::vector<std::unique_ptr<TurnCheckpoint>> c, int keep) {
  std::vector<std::unique_ptr<TurnCheckpoint>> all;
  const int first_new = c.empty() ? committed_len() + 1 : c.front()->pos;
  for (std::unique_ptr<TurnCheckpoint>& old : prefix_checkpoints_) {
    if (old->pos < first_new && old->pos <= committed_len()) {
      all.push_back(std::move(old));
    }
  }
  for (std::unique_ptr<TurnCheckpoint>& n : c) all.push_back(std::move(n));
  const size_t drop = all.size() > static_cast<size_t>(std::max(keep, 0))
                          ? all.size() - static_cast<size_t>(std::max(keep, 0))
                          : 0;
  prefix_checkpoints_.assign(std::make_move_iterator(all.begin() + drop),
                             std::make_move_iterator(all.end()));
}

const TurnCheckpoint* SpecSession::PrefixCheckpointAt(int pos) const {
  if (pos > committed_len() || caches_ == nullptr) return nullptr;
  for (const std::unique_ptr<TurnCheckpoint>& c : prefix_checkpoints_) {
    if (c->pos == pos) return c.get();
  }
  return nullptr;
}

std::vector<int> SpecSession::prefix_checkpoint_positions() const {
  std::vector<int> out;
  for (const std::unique_ptr<TurnCheckpoint>& c : prefix_checkpoints_) {
    if (c->pos <= committed_len()) out.push_back(c->pos);
  }
  return out;
}

void SpecSession::MarkDemoted() {
  CHECK(demote_ready()) << "session " << id_
                        << ": demotion needs a flushed session with next_pred";
  // The prompt checkpoint is trunk state only (no draft state), so a demoted
  // session can still REWIND to it. Owed MTP rows go with the draft state.
  mode_ = DecodeMode::kBatched;
  deferred_mtp_ = DeferredMtp{};
}

bool SpecSession::reset_graph_fallback_on_resume() {
  if (!graph_fallback_) return false;
  graph_fallback_ = false;
  LOG(INFO) << "session " << id_
            << ": cleared the draft-graph fallback flag on resume";
  return true;
}

void SpecSession::CheckInvariants() const {
  CHECK(caches_ != nullptr) << "session " << id_ << " has no caches";
  if (!deferred_mtp_.empty()) {
    CHECK(can_draft()) << "session " << id_
                       << ": deferred MTP rows without draft state";
    CHECK_EQ(deferred_mtp_.end_row(), committed_len() - 1)
        << "session " << id_ << ": deferred MTP rows are not the last ones";
  }
  CHECK_EQ(committed_len(), caches_->length())
      << "session " << id_ << ": committed tokens != cache rows";
  CHECK_EQ(caches_->verified_columns(), 0)
      << "session " << id_ << ": a verify is pending at a burst boundary";
  CHECK_LE(caches_->length(), caches_->capacity());
  if (pending_tok.has_value()) {
    CHECK(!next_pred.has_value())
        << "session " << id_ << ": pending carried but next_pred set";
    // The carried token must be committable by a flush.
    CHECK_LT(caches_->length(), caches_->capacity())
        << "session " << id_ << ": no row left for the pending token";
  }
  if (!pending_tok.has_value() && committed_len() > 0) {
    // The first token of the next burst may be sampled from them.
    CHECK(!last_logits_.empty())
        << "session " << id_ << ": nothing pending but no last logits";
  }
  if (can_draft() && committed_len() > 0) {
    CHECK_EQ(caches_->mtp_length(), committed_len() - 1)
        << "session " << id_ << ": MTP KV is not filled up to the last row";
  }
}

}  // namespace specserve::spec
