#include "scheduler/prefix_cache.h"

#include <algorithm>
#include <utility>

#include "glog/logging.h"

namespace specserve::scheduler {

// A radix-tree node: the tokens from its parent (`edge`, empty at a root)
// and the sessions with a reusable position exactly here. A node's depth is
// the length of the history it stands for.
struct PrefixCache::Node {
  std::vector<uint32_t> edge;
  Node* parent = nullptr;
  std::map<uint32_t, std::unique_ptr<Node>> children;  // by edge[0]
  std::set<std::string> sessions;
};

PrefixCache::PrefixCache(PrefixCacheOptions options) : options_(options) {}
PrefixCache::~PrefixCache() = default;

PrefixCache::Node* PrefixCache::Root(const std::string& tenant) {
  std::unique_ptr<Node>& root = roots_[tenant];
  if (root == nullptr) root = std::make_unique<Node>();
  return root.get();
}

PrefixCache::Node* PrefixCache::InsertLocked(
    Node* node, absl::Span<const uint32_t> tokens) {
  size_t i = 0;
  while (i < tokens.size()) {
    auto it = node->children.find(tokens[i]);
    if (it == node->children.end()) {
      auto leaf = std::make_unique<Node>();
      leaf->edge.assign(tokens.begin() + i, tokens.end());
      leaf->parent = node;
      Node* out = leaf.get();
      node->children.emplace(tokens[i], std::move(leaf));
      return out;
    }
    Node* child = it->second.get();
    size_t m = 0;
    while (m < child->edge.size() && i + m < tokens.size() &&
           child->edge[m] == tokens[i + m]) {
      ++m;
    }
    if (m < child->edge.size()) {
      // Split: a new node takes the common part; the child (and every
      // Node* to it) stays the node of the longer history.
      auto mid = std::make_unique<Node>();
      mid->edge.assign(child->edge.begin(), child->edge.begin() + m);
      mid->parent = node;
      std::unique_ptr<Node> moved = std::move(it->second);
      moved->edge.erase(moved->edge.begin(), moved->edge.begin() + m);
      moved->parent = mid.get();
      mid->children.emplace(moved->edge[0], std::move(moved));
      Node* mid_ptr = mid.get();
      it->second = std::move(mid);
      child = mid_ptr;
    }
    node = child;
    i += m;
  }
  return node;
}

void PrefixCache::RemoveLocked(const std::string& session_id, Session* s) {
  for (Node* node : s->nodes) {
    node->sessions.erase(session_id);
    // Prune leaves left empty; a node with children stays (it may be the
    // split point of other histories).
    while (node->parent != nullptr && node->sessions.empty() &&
           node->children.empty()) {
      Node* parent = node->parent;
      parent->children.erase(node->edge[0]);
      node = parent;
    }
  }
  s->nodes.clear();
}

std::vector<PrefixSource> PrefixCache::Record(
    const std::string& tenant, const PrefixSource& source,
    absl::Span<const uint32_t> history, absl::Span<const uint32_t> positions) {
  absl::MutexLock lock(&mu_);
  auto [it, added] = sessions_.try_emplace(source.session_id);
  Session& s = it->second;
  if (!added) {
    RemoveLocked(source.session_id, &s);
    if (s.source.owned) --owned_;
    lru_.erase(s.lru);
  }
  s.tenant = tenant;
  s.source = source;
  if (source.owned) ++owned_;
  s.last_used = ++tick_;
  s.lru = lru_.insert(lru_.end(), source.session_id);
  Node* root = Root(tenant);
  for (uint32_t pos : std::set<uint32_t>(positions.begin(), positions.end())) {
    if (pos == 0 || pos > history.size()) continue;
    Node* node = InsertLocked(root, history.subspan(0, pos));
    node->sessions.insert(source.session_id);
    s.nodes.push_back(node);
  }
  std::vector<PrefixSource> evicted;
  EnforceLimitsLocked(&evicted);
  return evicted;
}

void PrefixCache::EnforceLimitsLocked(std::vector<PrefixSource>* evicted) {
  auto it = lru_.begin();
  while (it != lru_.end() && (sessions_.size() > options_.max_sessions ||
                              owned_ > options_.max_owned)) {
    Session& s = sessions_.at(*it);
    // Over the owned limit only: keep the sessions the cache does not own.
    if (sessions_.size() <= options_.max_sessions && !s.source.owned) {
      ++it;
      continue;
    }
    const std::string id = *it;
    it = lru_.erase(it);
    RemoveLocked(id, &s);
    if (s.source.owned) {
      --owned_;
      evicted->push_back(s.source);
    }
    sessions_.erase(id);
  }
}

std::vector<PrefixHit> PrefixCache::Lookup(const std::string& tenant,
                                           absl::Span<const uint32_t> prompt,
                                           size_t max_hits) const {
  absl::MutexLock lock(&mu_);
  std::vector<PrefixHit> hits;
  auto root = roots_.find(tenant);
  if (root == roots_.end()) return hits;
  // Nodes fully matched by the prompt, shallowest first.
  std::vector<std::pair<const Node*, uint32_t>> path;
  const Node* node = root->second.get();
  size_t depth = 0;
  while (depth < prompt.size()) {
    auto it = node->children.find(prompt[depth]);
    if (it == node->children.end()) break;
    const Node* child = it->second.get();
    if (child->edge.size() > prompt.size() - depth ||
        !std::equal(child->edge.begin(), child->edge.end(),
                    prompt.begin() + depth)) {
      break;
    }
    depth += child->edge.size();
    node = child;
    if (!node->sessions.empty()) path.emplace_back(node, depth);
  }
  for (auto p = path.rbegin(); p != path.rend() && hits.size() < max_hits;
       ++p) {
    std::vector<const Session*> here;
    for (const std::string& id : p->first->sessions) {
      here.push_back(&sessions_.at(id));
    }
    std::sort(here.begin(), here.end(), [](const Session* a, const Session* b) {
      return a->last_used > b->last_used;
    });
    for (const Session* s : here) {
      if (hits.size() >= max_hits) break;
      hits.push_back(PrefixHit{s->source, p->second});
    }
  }
  return hits;
}

void PrefixCache::Touch(const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  it->second.last_used = ++tick_;
  lru_.erase(it->second.lru);
  it->second.lru = lru_.insert(lru_.end(), session_id);
}

PrefixSource PrefixCache::Forget(const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return PrefixSource{};
  PrefixSource source = it->second.source;
  RemoveLocked(session_id, &it->second);
  lru_.erase(it->second.lru);
  if (source.owned) --owned_;
  sessions_.erase(it);
  return source;
}

std::vector<PrefixSource> PrefixCache::Clear() {
  absl::MutexLock lock(&mu_);
  std::vector<PrefixSource> owned;
  for (auto& [id, s] : sessions_) {
    if (s.source.owned) owned.push_back(s.source);
  }
  sessions_.clear();
  lru_.clear();
  roots_.clear();
  owned_ = 0;
  return owned;
}

size_t PrefixCache::sessions() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

size_t PrefixCache::owned() const {
  absl::MutexLock lock(&mu_);
  return owned_;
}

}  // namespace specserve::scheduler
