#include "scheduler/residency_sync.h"

#include "glog/logging.h"

namespace specserve::scheduler {

std::vector<std::string> ResidencySync::WorkerLost(int index,
                                                   absl::Time as_of) {
  std::vector<std::string> lost = table_->MarkWorkerLost(index, as_of);
  if (!lost.empty()) {
    LOG(INFO) << lost.size() << " session(s) on worker " << index
              << " marked LOST (the worker is gone or silent); rebuilt "
              << "from history on their next turn";
  }
  // Should the worker come back still holding them, nothing would use them.
  return lost;
}

std::vector<std::string> ResidencySync::WorkerSessions(
    int index, absl::Time as_of,
    const specserve::worker::v1::SessionList& list) {
  std::vector<SessionTable::WorkerCopy> copies;
  copies.reserve(list.sessions_size());
  for (const auto& e : list.sessions()) {
    SessionTable::WorkerCopy c;
    c.id = e.session_id();
    switch (e.residency()) {
      case specserve::worker::v1::OFFLOADED:
        c.residency = specserve::v1::OFFLOADED;
        break;
      case specserve::worker::v1::PARKED:
        c.residency = specserve::v1::PARKED;
        break;
      default:
        c.residency = specserve::v1::ACTIVE;  // a call holds it
        break;
    }
    copies.push_back(std::move(c));
  }
  SessionTable::Reconciled r = table_->ReconcileWorker(index, copies, as_of);
  if (!r.lost.empty() || !r.abandoned.empty()) {
    LOG(INFO) << "worker " << index << " holds " << copies.size()
              << " session(s): " << r.lost.size() << " marked LOST (gone "
              << "from the worker), " << r.abandoned.size()
              << " abandoned copies released";
  }
  return r.abandoned;
}

}  // namespace specserve::scheduler
