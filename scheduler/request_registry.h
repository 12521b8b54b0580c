// In-flight Generate requests by request id and session id, so Admin.Abort
// can cancel them. A request polls its cancel flag at token granularity.
#ifndef SPECSERVE_SCHEDULER_REQUEST_REGISTRY_H_
#define SPECSERVE_SCHEDULER_REQUEST_REGISTRY_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"

namespace specserve::scheduler {

class RequestRegistry {
 public:
  using CancelFlag = std::shared_ptr<std::atomic<bool>>;

  // Registers a request; nullptr while another request with the same id is
  // registered (the caller refuses it: ABORTED, proto/specserve.proto).
  CancelFlag Register(const std::string& request_id);
  void SetSession(const std::string& request_id, const std::string& session_id);
  void Unregister(const std::string& request_id);

  // Number of requests cancelled.
  int AbortRequest(const std::string& request_id);
  int AbortSession(const std::string& session_id);
  // Every request (shutdown after the drain grace period).
  int AbortAll();
  int size() const;

 private:
  struct Entry {
    CancelFlag flag;
    std::string session_id;
  };
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> requests_ ABSL_GUARDED_BY(mu_);
};

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_REQUEST_REGISTRY_H_
