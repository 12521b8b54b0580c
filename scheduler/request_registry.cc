#include "scheduler/request_registry.h"

namespace specserve::scheduler {

RequestRegistry::CancelFlag RequestRegistry::Register(
    const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  if (requests_.count(request_id)) return nullptr;
  auto flag = std::make_shared<std::atomic<bool>>(false);
  requests_[request_id] = Entry{flag, ""};
  return flag;
}

void RequestRegistry::SetSession(const std::string& request_id,
                                 const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(request_id);
  if (it != requests_.end()) it->second.session_id = session_id;
}

void RequestRegistry::Unregister(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  requests_.erase(request_id);
}

int RequestRegistry::AbortRequest(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return 0;
  it->second.flag->store(true);
  return 1;
}

int RequestRegistry::AbortSession(const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (auto& [id, e] : requests_) {
    if (e.session_id == session_id) {
      e.flag->store(true);
      ++n;
    }
  }
  return n;
}

int RequestRegistry::AbortAll() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, e] : requests_) e.flag->store(true);
  return static_cast<int>(requests_.size());
}

int RequestRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(requests_.size());
}

}  // namespace specserve::scheduler
