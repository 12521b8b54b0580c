// n > 1 samples of one engine-protocol Generate (SamplingParams.n): each
// sample is its own one-shot specserve request (request_translator.h
// SampleRequest: its own seed stream and request id), and their responses
// share the gateway's stream, each chunk and complete carrying its sample's
// index, as vLLM's do.
//
// With prefix reuse on (--prefix_cache_sessions), the prompt runs alone
// first (PrefillRequest: one greedy token, nothing shown): the scheduler
// keeps its session parked, and every sample forks it instead of
// prefilling the prompt again (docs/DESIGN.md "Prefix reuse"); without
// prefix reuse each sample prefills. Sample 0 runs first and the others
// once it has streamed its first token, so that they do not queue behind
// each other's forks of one source.
#ifndef SPECSERVE_SCHEDULER_VLLM_ENGINE_SAMPLE_FANOUT_H_
#define SPECSERVE_SCHEDULER_VLLM_ENGINE_SAMPLE_FANOUT_H_

#include <cstdint>
#include <functional>

#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/sync_stream.h"
#include "proto/specserve.pb.h"
#include "vllm_engine.pb.h"

namespace specserve::scheduler::vllm_engine {

// The request that prefills `request`'s prompt for its samples: greedy, one
// token, no logprobs, no constraint, speculative as `request` is (a
// speculative fork needs its source's draft state), its own request id
// ("<id>#prefill").
specserve::v1::GenerateRequest PrefillRequest(
    const specserve::v1::GenerateRequest& request);

// Takes a request's events and drops them (PrefillRequest's output).
class DiscardingEventWriter final
    : public grpc::internal::WriterInterface<specserve::v1::GenerateEvent> {
 public:
  bool Write(const specserve::v1::GenerateEvent&, grpc::WriteOptions) override {
    return true;
  }
};

// One sample's view of the shared stream: sets the index on every response
// and serializes the writes of concurrent samples. `on_first` (may be
// null) runs after the sample's first write.
class IndexedWriter final : public grpc::internal::WriterInterface<
                                ::vllm::grpc::engine::GenerateResponse> {
 public:
  IndexedWriter(
      grpc::internal::WriterInterface<::vllm::grpc::engine::GenerateResponse>*
          out,
      absl::Mutex* mu, uint32_t index, std::function<void()> on_first = nullptr)
      : out_(out), mu_(mu), index_(index), on_first_(std::move(on_first)) {}

  bool Write(const ::vllm::grpc::engine::GenerateResponse& response,
             grpc::WriteOptions options) override;

 private:
  grpc::internal::WriterInterface<::vllm::grpc::engine::GenerateResponse>* const
      out_;
  absl::Mutex* const mu_;
  const uint32_t index_;
  std::function<void()> on_first_;
};

// Runs `n` samples: run(i, writer) runs sample i to its end writing to
// `writer` (an IndexedWriter over `out`) and returns its status. Sample 0
// on this thread, the others on their own once sample 0 wrote its first
// response (or ended). Returns the first failed sample's status (by index),
// else OK, once all have ended.
grpc::Status RunSamples(
    uint32_t n,
    grpc::internal::WriterInterface<::vllm::grpc::engine::GenerateResponse>*
        out,
    const std::function<grpc::Status(
        uint32_t, grpc::internal::WriterInterface<
                      ::vllm::grpc::engine::GenerateResponse>*)>& run);

}  // namespace specserve::scheduler::vllm_engine

#endif  // SPECSERVE_SCHEDULER_VLLM_ENGINE_SAMPLE_FANOUT_H_
