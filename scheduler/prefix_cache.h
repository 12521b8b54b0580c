// Where the reusable states of recent token histories are (automatic prefix
// reuse, docs/DESIGN.md "Prefix reuse"): a radix tree over token histories,
// one per tenant, whose entries say "the state after tokens[0:pos] is held by
// session S on worker W". A pure data structure: the caller checks an entry
// against the session table and the worker before using it, and the worker
// checks the tokens again (proto/worker.proto ForkSession), so a stale entry
// costs a lookup, never a wrong answer.
//
// Usage:
//   cache.Record(tenant, {.session_id = id, .worker = w, ...}, history,
//                {rewind_pos, history.size()});  // when a session parks
//   for (const PrefixHit& hit : cache.Lookup(tenant, prompt, 4)) ...
//   cache.Forget(id);  // its copy is gone
//
// Invariants:
// - An entry matches only prompts of its own tenant (one tree per tenant).
// - Lookup returns entries whose tokens are a prefix of the prompt, longest
//   first, most recently used first among equals.
// - Each session has at most the positions of its last Record; the tree
//   holds at most max_sessions sessions and max_owned owned ones, evicting
//   least recently used sessions (Record and Lookup hits are uses). Evicted
//   owned sessions are returned to the caller, who releases them.
// Thread-safe.
#ifndef SPECSERVE_SCHEDULER_PREFIX_CACHE_H_
#define SPECSERVE_SCHEDULER_PREFIX_CACHE_H_

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace specserve::scheduler {

struct PrefixCacheOptions {
  // Sessions whose positions the tree holds (bounds its memory).
  size_t max_sessions = 4096;
  // Of those, sessions the cache owns (finished one-shot requests kept
  // parked for reuse): each holds worker memory until released.
  size_t max_owned = 64;
};

// Whose state an entry names.
struct PrefixSource {
  std::string session_id;
  // The session table tenant the session is filed under (for an owned one,
  // the cache's internal tenant; else the caller's).
  std::string table_tenant;
  int worker = -1;
  // The cache owns the session: it releases it when the entry is evicted.
  bool owned = false;
};

struct PrefixHit {
  PrefixSource source;
  uint32_t pos = 0;  // the state after prompt[0:pos]
};

class PrefixCache {
 public:
  explicit PrefixCache(PrefixCacheOptions options = {});
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // Records the reusable `positions` (each 1..history.size(); others are
  // ignored) of `source`'s `history`, replacing the session's earlier ones,
  // and marks it most recently used. Returns the owned sessions evicted to
  // stay within the limits: the caller releases them.
  std::vector<PrefixSource> Record(const std::string& tenant,
                                   const PrefixSource& source,
                                   absl::Span<const uint32_t> history,
                                   absl::Span<const uint32_t> positions);
  // Up to `max_hits` entries of `tenant` whose tokens are a prefix of
  // `prompt` (see the invariants for the order).
  std::vector<PrefixHit> Lookup(const std::string& tenant,
                                absl::Span<const uint32_t> prompt,
                                size_t max_hits) const;
  // Marks a session most recently used (a hit was used).
  void Touch(const std::string& session_id);
  // Drops a session's entries; returns its source (nullopt-like: an empty
  // session_id when it had none).
  PrefixSource Forget(const std::string& session_id);
  // Drops every entry (the model changed); returns the owned sessions.
  std::vector<PrefixSource> Clear();

  size_t sessions() const;
  size_t owned() const;

 private:
  struct Node;
  struct Session {
    std::string tenant;
    PrefixSource source;
    std::vector<Node*> nodes;  // one per recorded position
    uint64_t last_used = 0;
    std::list<std::string>::iterator lru;  // in lru_
  };

  Node* Root(const std::string& tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The node at tokens (splitting an edge when needed).
  Node* InsertLocked(Node* root, absl::Span<const uint32_t> tokens)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the session's entries and prunes empty leaves.
  void RemoveLocked(const std::string& session_id, Session* s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts least recently used sessions past the limits into `evicted`.
  void EnforceLimitsLocked(std::vector<PrefixSource>* evicted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PrefixCacheOptions options_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Node>> roots_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);  // front = oldest
  size_t owned_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_PREFIX_CACHE_H_
