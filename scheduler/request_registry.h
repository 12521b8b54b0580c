// In-flight Generate requests by (tenant, request id) and session id, so
// Admin.Abort can cancel them. A request polls its cancel flag at token
// granularity.
//
// Request ids are the client's choice, so each tenant has its own: the same
// id in two tenants names two requests, and no call of one tenant finds,
// refuses or aborts a request of another (scheduler/authenticator.h).
#ifndef SPECSERVE_SCHEDULER_REQUEST_REGISTRY_H_
#define SPECSERVE_SCHEDULER_REQUEST_REGISTRY_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"

namespace specserve::scheduler {

class RequestRegistry {
 public:
  using CancelFlag = std::shared_ptr<std::atomic<bool>>;

  // Registers a request; nullptr while the tenant has another request with
  // the same id registered (the caller refuses it: ABORTED,
  // proto/specserve.proto).
  CancelFlag Register(const std::string& tenant, const std::string& request_id);
  void SetSession(const std::string& tenant, const std::string& request_id,
                  const std::string& session_id);
  void Unregister(const std::string& tenant, const std::string& request_id);

  // Number of requests cancelled: the tenant's request with this id (0 or
  // 1), or the tenant's requests on a session.
  int AbortRequest(const std::string& tenant, const std::string& request_id);
  int AbortSession(const std::string& tenant, const std::string& session_id);
  // Every request of every tenant (Admin.Abort of everything, the drain's
  // cut-off).
  int AbortAll();
  int size() const;

 private:
  using Key = std::pair<std::string, std::string>;  // (tenant, request id)
  struct Entry {
    CancelFlag flag;
    std::string session_id;
  };
  mutable absl::Mutex mu_;
  std::map<Key, Entry> requests_ ABSL_GUARDED_BY(mu_);
};

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_REQUEST_REGISTRY_H_
