#include "scheduler/tokenizer/bpe.h"

#include <queue>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "scheduler/tokenizer/byte_level.h"

namespace specserve::tokenizer {

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(
    const BpeConfig& config) {
  std::unique_ptr<BpeModel> model(new BpeModel());
  for (int b = 0; b < 256; ++b) {
    std::string token = BytesToByteLevel(std::string(1, static_cast<char>(b)));
    auto it = config.vocab.find(token);
    model->byte_ids_[b] = it == config.vocab.end() ? kNoId : it->second;
  }
  model->merges_.reserve(config.merges.size());
  for (size_t rank = 0; rank < config.merges.size(); ++rank) {
    const auto& [left, right] = config.merges[rank];
    auto l = config.vocab.find(left);
    auto r = config.vocab.find(right);
    auto m = config.vocab.find(left + right);
    if (l == config.vocab.end() || r == config.vocab.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.merges[", rank, "] (\"", left, "\", \"", right,
                       "\") names a token missing from model.vocab"));
    }
    if (m == config.vocab.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.merges[", rank, "] (\"", left, "\", \"", right,
                       "\") makes a token missing from model.vocab"));
    }
    const uint64_t key = (static_cast<uint64_t>(l->second) << 32) | r->second;
    // HF builds its merge map by collecting (pair -> rank) in order, so a
    // repeated pair keeps its last rank.
    model->merges_.insert_or_assign(
        key, Merge{static_cast<uint32_t>(rank), m->second});
  }
  if (config.ignore_merges) {
    for (const auto& [token, id] : config.vocab) {
      std::string raw;
      if (ByteLevelToBytes(token, &raw)) model->raw_vocab_.emplace(raw, id);
    }
  }
  model->ignore_merges_ = config.ignore_merges;
  model->unk_id_ = config.unk_id;
  model->fuse_unk_ = config.fuse_unk;
  model->cache_ = std::make_unique<CacheShard[]>(kCacheShards);
  return model;
}

// O(n^2) but allocation-free: the common case (words of a few bytes).
void BpeModel::MergeSmall(std::vector<uint32_t>* ids) const {
  std::vector<uint32_t>& s = *ids;
  while (s.size() > 1) {
    uint32_t best_rank = UINT32_MAX, best_id = 0;
    size_t best_pos = 0;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const Merge* m = FindMerge(s[i], s[i + 1]);
      if (m != nullptr && m->rank < best_rank) {
        best_rank = m->rank;
        best_id = m->new_id;
        best_pos = i;
      }
    }
    if (best_rank == UINT32_MAX) break;
    s[best_pos] = best_id;
    s.erase(s.begin() + best_pos + 1);
  }
}

// O(n log n) with a heap of candidate merges and a linked list of symbols; same
// order as MergeSmall: (rank, position) ascending.
void BpeModel::MergeLarge(std::vector<uint32_t>* ids) const {
  const int n = static_cast<int>(ids->size());
  std::vector<uint32_t>& id = *ids;
  std::vector<int> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    uint32_t rank;
    int pos;
    uint32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>,
                      std::greater<Candidate>>
      heap;
  auto push = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    if (const Merge* m = FindMerge(id[pos], id[next[pos]])) {
      heap.push({m->rank, pos, m->new_id});
    }
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    if (!alive[c.pos] || next[c.pos] < 0) continue;
    const int right = next[c.pos];
    // Stale if either side changed since the candidate was pushed.
    const Merge* m = FindMerge(id[c.pos], id[right]);
    if (m == nullptr || m->rank != c.rank || m->new_id != c.new_id) continue;
    id[c.pos] = c.new_id;
    alive[right] = false;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  size_t out = 0;
  for (int i = 0; i >= 0 && i < n; i = next[i]) id[out++] = id[i];
  id.resize(out);
}

void BpeModel::EncodeUncached(std::string_view word,
                              std::vector<uint32_t>* out) const {
  if (ignore_merges_) {
    auto it = raw_vocab_.find(absl::string_view(word.data(), word.size()));
    if (it != raw_vocab_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  std::vector<uint32_t> ids;
  ids.reserve(word.size());
  bool last_was_unk = false;
  for (char c : word) {
    const uint32_t byte_id = byte_ids_[static_cast<uint8_t>(c)];
    if (byte_id != kNoId) {
      ids.push_back(byte_id);
      last_was_unk = false;
    } else if (unk_id_.has_value()) {
      if (!(fuse_unk_ && last_was_unk)) ids.push_back(*unk_id_);
      last_was_unk = true;
    }
  }
  if (ids.size() <= 48) {
    MergeSmall(&ids);
  } else {
    MergeLarge(&ids);
  }
  out->insert(out->end(), ids.begin(), ids.end());
}

void BpeModel::EncodeWord(std::string_view word,
                          std::vector<uint32_t>* out) const {
  if (word.empty()) return;
  if (word.size() == 1) {
    const uint32_t id = byte_ids_[static_cast<uint8_t>(word[0])];
    if (id != kNoId) {
      out->push_back(id);
    } else if (unk_id_.has_value()) {
      out->push_back(*unk_id_);
    }
    return;
  }
  if (word.size() > kMaxCachedWord) {
    EncodeUncached(word, out);
    return;
  }
  // Debian's Abseil has its own string_view type (not std::string_view).
  const absl::string_view key(word.data(), word.size());
  CacheShard& shard =
      cache_[absl::Hash<absl::string_view>()(key) % kCacheShards];
  {
    absl::ReaderMutexLock lock(&shard.mu);
    auto it = shard.words.find(key);
    if (it != shard.words.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out->size();
  EncodeUncached(word, out);
  absl::MutexLock lock(&shard.mu);
  // A full shard starts over: cheap, and the hot words come back at once.
  if (shard.words.size() >= kMaxEntriesPerShard) shard.words.clear();
  shard.words.try_emplace(std::string(word), out->begin() + start, out->end());
}

}  // namespace specserve::tokenizer
