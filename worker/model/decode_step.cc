// Recorded steps and Model::DecodeStep, the step Decode and DecodeBatch
// share: one committed token for each of B sessions. On a backend that can
// record (CUDA graphs; op closures on the CPU), the step's device work, from
// the embedding to the argmax, is recorded once per (B, position bucket) and
// replayed; otherwise it runs op by op through RunTrunk. The MTP draft step
// (mtp.cc) and Verify (below, per session) record the same way.
//
// Why a replay is exact: a recorded step reads nothing baked in at
// recording time that differs between steps. The ids, each row's position
// and its cache pointers are copied into fixed workspace buffers before the
// replay (the session table, workspace.h), and every cache op that depends
// on them takes them from there (the kernels' session-batch mode, which is
// bit-identical per row to the one-session call). Verify's linear layers
// keep their state pointers as arguments, which is why its recordings
// belong to the session. Attention is launched for the bucket's last
// position; rows with fewer chunks skip the extra blocks.
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

int Model::GraphBucketLast(int position) {
  return (position / kGraphPositionBucket + 1) * kGraphPositionBucket - 1;
}

bool Model::GraphsApply(absl::Span<ModelState* const> states) const {
  if (!use_graphs_ || !backend_->CanRecord()) return false;
  for (const ModelState* s : states) {
    if (s->graph_fallback_) return false;
  }
  return true;
}

absl::Status Model::RunRecorded(
    RecordedSteps* steps, const GraphKey& key,
    absl::Span<ModelState* const> states,
    const std::function<absl::Status()>& device_ops) {
  auto it = steps->graphs.find(key);
  if (it == steps->graphs.end() && steps->warm.count(key) == 0) {
    // First use: op by op, so lazily grown buffers exist before recording.
    steps->warm.insert(key);
    ++graph_stats_.eager;
    return device_ops();
  }
  if (it == steps->graphs.end()) {
    absl::StatusOr<std::unique_ptr<kernels::Backend::Recording>> recording =
        absl::UnknownError("not recorded");
    if (absl::Status begin = backend_->BeginRecording(); !begin.ok()) {
      recording = begin;
    } else {
      absl::Status ops = device_ops();
      recording = backend_->EndRecording();  // always ends the recording
      if (!ops.ok() && recording.ok()) recording = ops;
    }
    if (!recording.ok()) {
      // Nothing ran: run the step op by op and keep these sessions off
      // recordings until they are resumed.
      LOG(WARNING) << "step of " << states.size()
                   << " sessions not recorded, running op by op: "
                   << recording.status();
      ++graph_stats_.failed;
      for (ModelState* s : states) s->graph_fallback_ = true;
      return device_ops();
    }
    if (steps->graphs.size() >= kMaxGraphs) steps->graphs.clear();
    it = steps->graphs.emplace(key, std::move(*recording)).first;
    ++graph_stats_.recorded;
  }
  SS_RETURN_IF_ERROR(backend_->Replay(*it->second));
  ++graph_stats_.replayed;
  return absl::OkStatus();
}

absl::Status Model::DecodeStep(absl::Span<ModelState* const> states,
                               absl::Span<const int32_t> tokens,
                               ForwardResult* out) {
  const int B = static_cast<int>(states.size());
  if (!GraphsApply(states)) {
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
  const int bucket_last = GraphBucketLast(max_position);
  SessionBatch batch;
  SS_RETURN_IF_ERROR(
      UploadSessionTable(states, positions, bucket_last, &batch));
  SS_RETURN_IF_ERROR(UploadIds(tokens));
  SS_RETURN_IF_ERROR(RunRecorded(
      &steps_, {static_cast<int>(StepKind::kDecode), B, bucket_last}, states,
      [&] {
        SS_RETURN_IF_ERROR(TrunkOps(states, slices, B, Mode::kCommit, &batch));
        return LmHead(0, B);
      }));
  for (ModelState* s : states) ++s->length_;
  return CopyRowsOut(0, B, out);
}

absl::Status Model::VerifyRecorded(ModelState* state,
                                   absl::Span<const int32_t> tokens,
                                   ForwardResult* out) {
  const int T = static_cast<int>(tokens.size());
  // Column t sits at position length + t of this session's caches.
  std::vector<ModelState*> rows(T, state);
  std::vector<int> positions(T);
  for (int t = 0; t < T; ++t) positions[t] = state->length_ + t;
  const int bucket_last = GraphBucketLast(positions.back());
  SessionBatch batch;
  SS_RETURN_IF_ERROR(UploadSessionTable(rows, positions, bucket_last, &batch));
  SS_RETURN_IF_ERROR(UploadIds(tokens));
  const Slice slice{0, T, state->length_};
  ModelState* const one[] = {state};
  SS_RETURN_IF_ERROR(RunRecorded(
      &state->verify_steps_,
      {static_cast<int>(StepKind::kVerify), T, bucket_last}, one, [&] {
        SS_RETURN_IF_ERROR(TrunkOps(one, absl::MakeConstSpan(&slice, 1), T,
                                    Mode::kVerify, &batch));
        return LmHead(0, T);
      }));
  return CopyRowsOut(0, T, out);
}

}  // namespace specserve::model
