// The largest request the worker's port accepts (gRPC's max receive message
// size, set explicitly: docs/RELIABILITY.md row 9, README.md "Security").
//
// The largest legitimate request is an Admit that rebuilds a session of the
// whole model context: `max_context` token ids, at most 5 bytes each on the
// wire (varints of 32-bit ids), plus the other fields. Anything larger is
// refused by gRPC (RESOURCE_EXHAUSTED) before it is parsed.
#ifndef SPECSERVE_WORKER_REQUEST_LIMITS_H_
#define SPECSERVE_WORKER_REQUEST_LIMITS_H_

#include <cstdint>

namespace specserve::worker {

// Bytes: 5 per context row plus 1 MiB of room, and never below gRPC's own
// default of 4 MiB.
int MaxWorkerRequestBytes(int64_t max_context);

}  // namespace specserve::worker

#endif  // SPECSERVE_WORKER_REQUEST_LIMITS_H_
