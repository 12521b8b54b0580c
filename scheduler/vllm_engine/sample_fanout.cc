#include "scheduler/vllm_engine/sample_fanout.h"

#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

namespace specserve::scheduler::vllm_engine {

namespace vproto = ::vllm::grpc::engine;

specserve::v1::GenerateRequest PrefillRequest(
    const specserve::v1::GenerateRequest& request) {
  specserve::v1::GenerateRequest r;
  r.set_request_id(absl::StrCat(request.request_id(), "#prefill"));
  if (request.has_token_ids()) {
    *r.mutable_token_ids() = request.token_ids();
  } else {
    r.set_text(request.text());
  }
  *r.mutable_speculation() = request.speculation();
  r.mutable_sampling()->set_temperature(0.0f);
  r.mutable_stopping()->set_max_tokens(1);
  r.mutable_response()->set_ids(false);
  r.mutable_response()->set_text(false);
  return r;
}

bool IndexedWriter::Write(const vproto::GenerateResponse& response,
                          grpc::WriteOptions options) {
  vproto::GenerateResponse indexed = response;
  if (indexed.has_chunk()) indexed.mutable_chunk()->set_index(index_);
  if (indexed.has_complete()) indexed.mutable_complete()->set_index(index_);
  bool ok;
  {
    absl::MutexLock lock(mu_);
    ok = out_->Write(indexed, options);
  }
  if (on_first_) std::exchange(on_first_, nullptr)();
  return ok;
}

grpc::Status RunSamples(
    uint32_t n, grpc::internal::WriterInterface<vproto::GenerateResponse>* out,
    const std::function<grpc::Status(
        uint32_t, grpc::internal::WriterInterface<vproto::GenerateResponse>*)>&
        run) {
  absl::Mutex mu;
  absl::Notification first_written;
  std::vector<grpc::Status> status(n);
  std::vector<std::thread> others;
  auto start_others = [&] {
    for (uint32_t i = 1; i < n; ++i) {
      others.emplace_back([&, i] {
        IndexedWriter w(out, &mu, i);
        status[i] = run(i, &w);
      });
    }
    first_written.Notify();
  };
  {
    IndexedWriter w0(out, &mu, 0, start_others);
    status[0] = run(0, &w0);
  }
  if (!first_written.HasBeenNotified()) start_others();
  for (std::thread& t : others) t.join();
  for (const grpc::Status& s : status) {
    if (!s.ok()) return s;
  }
  return grpc::Status::OK;
}

}  // namespace specserve::scheduler::vllm_engine
