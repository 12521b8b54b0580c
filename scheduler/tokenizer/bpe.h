// The byte-level BPE model: turns one pre-token (raw bytes) into vocabulary ids
// by applying merges in rank order, exactly as HF tokenizers' BPE model does
// (lowest rank first, leftmost first among equal ranks).
//
// Thread-safe: EncodeWord is const and may run concurrently; its word cache is
// sharded and guarded by mutexes.
#ifndef SPECSERVE_SCHEDULER_TOKENIZER_BPE_H_
#define SPECSERVE_SCHEDULER_TOKENIZER_BPE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace specserve::tokenizer {

struct BpeConfig {
  // Token (a byte-level string) -> id.
  absl::flat_hash_map<std::string, uint32_t> vocab;
  // Merges in rank order (rank = index): pairs of byte-level strings.
  std::vector<std::pair<std::string, std::string>> merges;
  // If a whole word is a vocabulary entry, emit it without merging (HF
  // `ignore_merges`).
  bool ignore_merges = false;
  // Id emitted for a byte missing from the vocabulary; nullopt drops the byte
  // (HF does the same when unk_token is null).
  std::optional<uint32_t> unk_id;
  bool fuse_unk = false;
};

class BpeModel {
 public:
  // Fails when a merge names a token, or makes a token, that is not in the
  // vocab.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(
      const BpeConfig& config);

  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Appends the ids of `word` (raw bytes, not yet byte-level mapped) to `out`.
  void EncodeWord(std::string_view word, std::vector<uint32_t>* out) const;

 private:
  struct Merge {
    uint32_t rank;
    uint32_t new_id;
  };
  static constexpr uint32_t kNoId = UINT32_MAX;
  // Words longer than this are not cached (rare, and they would crowd the
  // cache).
  static constexpr size_t kMaxCachedWord = 96;
  static constexpr size_t kCacheShards = 32;
  static constexpr size_t kMaxEntriesPerShard = 8192;

  struct CacheShard {
    mutable absl::Mutex mu;
    absl::flat_hash_map<std::string, std::vector<uint32_t>> words
        ABSL_GUARDED_BY(mu);
  };

  BpeModel() = default;
  const Merge* FindMerge(uint32_t left, uint32_t right) const {
    auto it = merges_.find((static_cast<uint64_t>(left) << 32) | right);
    return it == merges_.end() ? nullptr : &it->second;
  }
  // Merges `ids` in place (the initial per-byte symbols).
  void MergeSmall(std::vector<uint32_t>* ids) const;
  void MergeLarge(std::vector<uint32_t>* ids) const;
  void EncodeUncached(std::string_view word, std::vector<uint32_t>* out) const;

  std::array<uint32_t, 256> byte_ids_;  // id of each byte's one-char token
  absl::flat_hash_map<uint64_t, Merge>
      merges_;  // (left << 32 | right) -> merge
  // Raw bytes of every byte-level vocab entry -> id (for ignore_merges).
  absl::flat_hash_map<std::string, uint32_t> raw_vocab_;
  bool ignore_merges_ = false;
  std::optional<uint32_t> unk_id_;
  bool fuse_unk_ = false;
  std::unique_ptr<CacheShard[]> cache_;
};

}  // namespace specserve::tokenizer

#endif  // SPECSERVE_SCHEDULER_TOKENIZER_BPE_H_
