#include "worker/request_limits.h"

#include <algorithm>
#include <limits>

namespace specserve::worker {

int MaxWorkerRequestBytes(int64_t max_context) {
  constexpr int64_t kBytesPerId = 5;  // a uint32 varint
  constexpr int64_t kRoom = int64_t{1} << 20;
  constexpr int64_t kFloor = int64_t{4} << 20;  // gRPC's default
  const int64_t want =
      std::max(kFloor, std::max<int64_t>(max_context, 0) * kBytesPerId + kRoom);
  return static_cast<int>(
      std::min<int64_t>(want, std::numeric_limits<int>::max()));
}

}  // namespace specserve::worker
