// Incremental stop-string matching over streamed text. The scheduler feeds
// each text delta it is about to send; the matcher returns what is safe to
// emit now, holding back any tail that could still become a stop string, and
// reports the first stop string hit (generation then ends with STOP, and the
// stop string itself is not returned, per specserve.proto).
//
// Usage:
//   StopStringMatcher m(request.stopping().stop());
//   for each delta: auto r = m.Feed(delta);
//                   send r.emit; if (r.stopped) { cancel the burst; break; }
//   at the end (no stop hit): send m.Flush();
//
// Invariants:
// - emitted text + held text == all text fed so far, up to the first stop
//   string (text after it is dropped).
// - The held text is the longest suffix of the unsent text that is a proper
//   prefix of some stop string, so it is shorter than the longest stop string.
// - The first stop string to complete wins: the match with the earliest end
//   in the text, and at equal ends the longest (earliest start). Generation
//   stops as soon as any stop string appears, and the result does not depend
//   on how the text is split into deltas.
// - Given UTF-8 deltas made of whole characters and UTF-8 stop strings, every
//   emitted piece is whole characters: a hold-back begins where a stop string
//   begins, which is a character boundary.
// Not thread-safe (one matcher per request).
#ifndef SPECSERVE_SCHEDULER_STOP_STRINGS_H_
#define SPECSERVE_SCHEDULER_STOP_STRINGS_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace specserve::scheduler {

class StopStringMatcher {
 public:
  // Empty stop strings are ignored. Any container of strings works.
  template <typename Container>
  explicit StopStringMatcher(const Container& stops) {
    for (const auto& s : stops) Add(s);
  }
  StopStringMatcher() = default;

  struct Result {
    // Text safe to send now (possibly empty).
    std::string emit;
    // A stop string was found; `emit` ends right before it. Every later Feed
    // returns nothing.
    bool stopped = false;
    // Which stop string matched (when stopped).
    std::string matched;
  };

  Result Feed(absl::string_view delta);
  // End of generation without a stop: the held-back text, now safe to send.
  std::string Flush();

  bool stopped() const { return stopped_; }
  bool empty() const { return stops_.empty(); }
  // Bytes currently held back.
  size_t held() const { return held_.size(); }

 private:
  void Add(absl::string_view stop);

  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace specserve::scheduler

#endif  // SPECSERVE_SCHEDULER_STOP_STRINGS_H_
