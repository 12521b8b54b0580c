#include "scheduler/stop_strings.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"

namespace specserve::scheduler {

void StopStringMatcher::Add(absl::string_view stop) {
  if (!stop.empty()) stops_.emplace_back(stop);
}

StopStringMatcher::Result StopStringMatcher::Feed(absl::string_view delta) {
  Result result;
  if (stopped_) {
    result.stopped = true;
    return result;
  }
  if (stops_.empty()) {
    result.emit = std::string(delta);
    return result;
  }
  std::string text = std::move(held_);
  held_.clear();
  text.append(delta.data(), delta.size());

  // The match that completes first (earliest end; at equal ends the longest,
  // i.e. earliest start). This does not depend on how the text was split into
  // deltas. The held text alone contained no match (else we would have
  // stopped), so every match ends inside the new delta; a stop string's first
  // occurrence is its earliest-ending one.
  size_t best_pos = std::string::npos;
  size_t best_end = std::string::npos;
  const std::string* best = nullptr;
  for (const std::string& stop : stops_) {
    const size_t pos = text.find(stop);
    if (pos == std::string::npos) continue;
    const size_t end = pos + stop.size();
    if (best == nullptr || end < best_end ||
        (end == best_end && pos < best_pos)) {
      best_pos = pos;
      best_end = end;
      best = &stop;
    }
  }
  if (best != nullptr) {
    stopped_ = true;
    result.stopped = true;
    result.matched = *best;
    text.resize(best_pos);
    result.emit = std::move(text);
    return result;
  }

  // Hold back the longest suffix that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    const size_t max_len = std::min(stop.size() - 1, text.size());
    for (size_t len = max_len; len > hold; --len) {
      if (absl::EndsWith(text, absl::string_view(stop).substr(0, len))) {
        hold = len;
        break;
      }
    }
  }
  held_ = text.substr(text.size() - hold);
  text.resize(text.size() - hold);
  result.emit = std::move(text);
  return result;
}

std::string StopStringMatcher::Flush() {
  if (stopped_) return "";
  return std::exchange(held_, std::string());
}

}  // namespace specserve::scheduler
