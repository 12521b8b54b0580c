// Model::DecodeStep: one committed token for each of B sessions, the step
// Decode and DecodeBatch share. On a backend that can record (CUDA graphs)
// the step's device work, from the embedding to the argmax, is recorded once
// per (B, position bucket) and replayed; otherwise it runs op by op through
// RunTrunk.
//
// Why a replay is exact: a recorded step reads nothing baked in at
// recording time that differs between steps. The ids, each session's
// position and its cache/state pointers are copied into fixed workspace
// buffers before the replay (the session table, workspace.h), and every
// cache op takes them from there (the kernels' session-batch mode, which is
// bit-identical per row to the one-session call). Attention is launched for
// the bucket's last position; rows with fewer chunks skip the extra blocks.
#include <algorithm>
#include <vector>

#include "glog/logging.h"
#include "telemetry/status_macros.h"
#include "worker/model/model.h"
#include "worker/model/workspace.h"

namespace specserve::model {
namespace {

// Recordings kept before the cache is emptied (each holds one graph of a
// few hundred nodes; keys grow with contexts and batch sizes).
constexpr size_t kMaxGraphs = 128;

}  // namespace

absl::Status Model::DecodeStep(absl::Span<ModelState* const> states,
                               absl::Span<const int32_t> tokens,
                               ForwardResult* out) {
  const int B = static_cast<int>(states.size());
  bool graphed = use_graphs_ && backend_->CanRecord();
  for (const ModelState* s : states) graphed = graphed && !s->graph_fallback_;
  if (!graphed) {
    std::vector<Slice> slices(B);
    for (int i = 0; i < B; ++i) slices[i] = Slice{i, 1, states[i]->length_};
    SS_RETURN_IF_ERROR(RunTrunk(states, slices, tokens, Mode::kCommit));
    for (ModelState* s : states) ++s->length_;
    return EmitRows(0, B, out);
  }

  std::vector<int> positions(B);
  std::vector<Slice> slices(B);
  int max_position = 0;
  for (int i = 0; i < B; ++i) {
    positions[i] = states[i]->length_;
    slices[i] = Slice{i, 1, positions[i]};
    max_position = std::max(max_position, positions[i]);
  }
  const int bucket_last =
      (max_position / kGraphPositionBucket + 1) * kGraphPositionBucket - 1;
  SessionBatch batch;
  SS_RETURN_IF_ERROR(UploadSessionTable(states, positions, bucket_last, &batch));
  SS_RETURN_IF_ERROR(backend_->CopyToDevice(ws_->ids.data(), tokens.data(),
                                            B * sizeof(int32_t)));
  auto device_step = [&]() -> absl::Status {
    SS_RETURN_IF_ERROR(TrunkOps(states, slices, B, Mode::kCommit, &batch));
    return LmHead(0, B);
  };

  const std::pair<int, int> key{B, bucket_last};
  auto it = graphs_.find(key);
  if (it == graphs_.end() && graph_warm_.count(key) == 0) {
    // First use: op by op, so lazily grown buffers exist before recording.
    graph_warm_.insert(key);
    ++graph_stats_.eager;
    SS_RETURN_IF_ERROR(device_step());
  } else if (it == graphs_.end()) {
    absl::StatusOr<std::unique_ptr<kernels::Backend::Recording>> recording =
        absl::UnknownError("not recorded");
    if (absl::Status begin = backend_->BeginRecording(); !begin.ok()) {
      recording = begin;
    } else {
      absl::Status ops = device_step();
      recording = backend_->EndRecording();  // always ends the recording
      if (!ops.ok() && recording.ok()) recording = ops;
    }
    if (!recording.ok()) {
      // Nothing ran: run the step op by op and keep these sessions off
      // recordings until they are resumed.
      LOG(WARNING) << "decode step of " << B
                   << " sessions not recorded, running op by op: "
                   << recording.status();
      ++graph_stats_.failed;
      for (ModelState* s : states) s->graph_fallback_ = true;
      SS_RETURN_IF_ERROR(device_step());
    } else {
      if (graphs_.size() >= kMaxGraphs) graphs_.clear();
      it = graphs_.emplace(key, std::move(*recording)).first;
      ++graph_stats_.recorded;
    }
  }
  if (it != graphs_.end()) {
    SS_RETURN_IF_ERROR(backend_->Replay(*it->second));
    ++graph_stats_.replayed;
  }
  for (ModelState* s : states) ++s->length_;
  return CopyRowsOut(0, B, out);
}

}  // namespace specserve::model
