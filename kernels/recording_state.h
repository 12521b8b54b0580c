// The bookkeeping every backend that records shares (kernels/backend.h,
// "Recording"): whether a recording is open, and the first call it refused,
// which EndRecording reports instead of a recording.
#ifndef SPECSERVE_KERNELS_RECORDING_STATE_H_
#define SPECSERVE_KERNELS_RECORDING_STATE_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace specserve::kernels {

class RecordingState {
 public:
  // `backend` names the backend in messages ("cpu", "cuda").
  explicit RecordingState(std::string backend) : backend_(std::move(backend)) {}

  bool active() const { return active_; }

  // Opens a recording; FAILED_PRECONDITION when one is open already.
  absl::Status Begin() {
    if (active_) return Error("already recording");
    active_ = true;
    refused_ = absl::OkStatus();
    return absl::OkStatus();
  }

  // Closes the recording: its first refusal, else OK; FAILED_PRECONDITION
  // when none was open.
  absl::Status End() {
    if (!active_) return Error("not recording");
    active_ = false;
    return std::exchange(refused_, absl::OkStatus());
  }

  // While recording: FAILED_PRECONDITION naming `what`, a call that cannot
  // be recorded (remembered for End). OK otherwise.
  absl::Status Refuse(const char* what) {
    if (!active_) return absl::OkStatus();
    absl::Status s = Error(absl::StrCat(what, " cannot be recorded"));
    if (refused_.ok()) refused_ = s;
    return s;
  }

 private:
  absl::Status Error(const std::string& what) const {
    return absl::FailedPreconditionError(
        absl::StrCat(backend_, " backend: ", what));
  }

  const std::string backend_;
  bool active_ = false;
  absl::Status refused_;
};

}  // namespace specserve::kernels

#endif  // SPECSERVE_KERNELS_RECORDING_STATE_H_
