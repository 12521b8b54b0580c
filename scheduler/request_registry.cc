#include "scheduler/request_registry.h"

namespace specserve::scheduler {

RequestRegistry::CancelFlag RequestRegistry::Register(
    const std::string& tenant, const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  const Key key(tenant, request_id);
  if (requests_.count(key)) return nullptr;
  auto flag = std::make_shared<std::atomic<bool>>(false);
  requests_[key] = Entry{flag, ""};
  return flag;
}

void RequestRegistry::SetSession(const std::string& tenant,
                                 const std::string& request_id,
                                 const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(Key(tenant, request_id));
  if (it != requests_.end()) it->second.session_id = session_id;
}

void RequestRegistry::Unregister(const std::string& tenant,
                                 const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  requests_.erase(Key(tenant, request_id));
}

int RequestRegistry::AbortRequest(const std::string& tenant,
                                  const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(Key(tenant, request_id));
  if (it == requests_.end()) return 0;
  it->second.flag->store(true);
  return 1;
}

int RequestRegistry::AbortSession(const std::string& tenant,
                                  const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (auto& [key, e] : requests_) {
    if (key.first == tenant && e.session_id == session_id) {
      e.flag->store(true);
      ++n;
    }
  }
  return n;
}

int RequestRegistry::AbortAll() {
  absl::MutexLock lock(&mu_);
  for (auto& [key, e] : requests_) e.flag->store(true);
  return static_cast<int>(requests_.size());
}

int RequestRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(requests_.size());
}

}  // namespace specserve::scheduler
