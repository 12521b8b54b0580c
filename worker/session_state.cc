#include "worker/session_state.h"

namespace specserve::worker {

specserve::worker::v1::SessionState SessionStateToProto(
    const spec::SpecSession& s,
    specserve::worker::v1::WorkerResidency residency, uint64_t bytes) {
  specserve::worker::v1::SessionState out;
  out.set_session_id(s.id());
  out.set_residency(residency);
  // BATCHED: the session runs plain decode only (demoted, or admitted
  // without draft state).
  out.set_mode(s.can_draft() ? specserve::v1::SPECULATIVE
                             : specserve::v1::BATCHED);
  out.set_committed_len(s.committed_len());
  out.set_capacity(s.cache_max_ctx());
  if (s.pending_tok) out.set_pending_tok(*s.pending_tok);
  if (s.next_pred) out.set_next_pred(*s.next_pred);
  if (s.rewind_pos()) out.set_rewind_pos(*s.rewind_pos());
  out.set_rewind_is_resident(s.rewind_is_resident());
  for (int pos : s.prefix_checkpoint_positions()) {
    out.add_prefix_checkpoints(static_cast<uint32_t>(pos));
  }
  *out.mutable_telemetry() = s.telem.ToProto();
  out.set_bytes(bytes);
  return out;
}

}  // namespace specserve::worker
