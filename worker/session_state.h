// Converts a worker session's state to the internal API's SessionState and
// telemetry messages (the one place that maps spec types onto the proto).
#ifndef SPECSERVE_WORKER_SESSION_STATE_H_
#define SPECSERVE_WORKER_SESSION_STATE_H_

#include "proto/worker.pb.h"
#include "worker/session_pool.h"
#include "worker/spec/spec_session.h"

namespace specserve::worker {

// `residency` is the pool's view; `bytes` what the session holds.
specserve::worker::v1::SessionState SessionStateToProto(
    const spec::SpecSession& s,
    specserve::worker::v1::WorkerResidency residency, uint64_t bytes);

}  // namespace specserve::worker

#endif  // SPECSERVE_WORKER_SESSION_STATE_H_
