// Keeps the session table's residency in line with what the worker pool's
// monitor sees (docs/DESIGN.md §2), so GetSession, ListSessions and the
// specserve_sessions{residency} gauge show where sessions really are:
// - a worker that is gone (unreachable), or silent for
//   WorkerPoolOptions::lost_after: its sessions become LOST at once, and
//   their copies there are released should it come back with them;
// - a worker that is merely slow (polls time out for less than lost_after)
//   keeps its sessions PARKED/OFFLOADED: it still holds them and resumes
//   them with no prefill when it answers again. A turn that comes meanwhile
//   does not wait: it rebuilds the session on another worker, and the copy
//   left behind is released before the slow worker is used again;
// - a restarted worker (a new WorkerInfo.instance) or one whose pool
//   offloaded or dropped idle sessions on its own (pool_epoch moved) sends
//   its session list: absent sessions become LOST, offloads show OFFLOADED,
//   and copies of this table's sessions placed elsewhere are released.
//   Sessions the table does not know are left alone (a worker may serve
//   several schedulers); those of a scheduler that exited go when the
//   worker's session lease runs out (worker/scheduler_lease.h).
// Sessions in a request are left to it (SessionTable::MarkWorkerLost).
#ifndef SPECSERVE_SCHEDULER_RESIDENCY_SYNC_H_
#define SPECSERVE_SCHEDULER_RESIDENCY_SYNC_H_

#include <string>
#include <vector>

#include "scheduler/session_table.h"
#include "scheduler/worker_pool.h"

namespace specserve::scheduler {

class ResidencySync : public WorkerSessionsListener {
 public:
  // `table` must outlive this.
  explicit ResidencySync(SessionTable* table) : table_(table) {}

  std::vector<std::string> WorkerLost(int index, absl::Time as_of) override;
  std::vector<std::string> WorkerSessions(
      int index, absl::Time as_of,
      const specserve::worker::v1::SessionList& list) override;

 private:
  SessionTable* const table_;
};

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_RESIDENCY_SYNC_H_
