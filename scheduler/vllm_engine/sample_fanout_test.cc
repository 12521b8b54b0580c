#include "scheduler/vllm_engine/sample_fanout.h"

#include <atomic>
#include <map>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace specserve::scheduler::vllm_engine {
namespace {

namespace vproto = ::vllm::grpc::engine;
using Sink = grpc::internal::WriterInterface<vproto::GenerateResponse>;

// Records what reaches the gateway's stream.
class RecordingSink final : public Sink {
 public:
  bool Write(const vproto::GenerateResponse& r, grpc::WriteOptions) override {
    absl::MutexLock lock(&mu_);
    written_.push_back(r);
    return true;
  }
  std::vector<vproto::GenerateResponse> written() {
    absl::MutexLock lock(&mu_);
    return written_;
  }

 private:
  absl::Mutex mu_;
  std::vector<vproto::GenerateResponse> written_;
};

vproto::GenerateResponse Chunk(uint32_t token) {
  vproto::GenerateResponse r;
  r.mutable_chunk()->add_token_ids(token);
  return r;
}

TEST(SampleFanoutTest, EverySampleWritesUnderItsIndexAfterSampleZerosFirst) {
  RecordingSink sink;
  std::atomic<bool> started_early{false};
  const grpc::Status s = RunSamples(4, &sink, [&](uint32_t i, Sink* w) {
    if (i > 0) {
      // Sample 0's first response is on the stream before any other starts.
      bool zero_wrote = false;
      for (const vproto::GenerateResponse& r : sink.written()) {
        zero_wrote = zero_wrote || (r.has_chunk() && r.chunk().index() == 0);
      }
      if (!zero_wrote) started_early = true;
    }
    for (uint32_t t = 0; t < 3; ++t) {
      w->Write(Chunk(100 * i + t), grpc::WriteOptions());
    }
    vproto::GenerateResponse done;
    done.mutable_complete()->set_finish_reason("length");
    w->Write(done, grpc::WriteOptions());
    return grpc::Status::OK;
  });
  EXPECT_TRUE(s.ok());
  EXPECT_FALSE(started_early);
  std::map<uint32_t, std::vector<uint32_t>> tokens;
  std::map<uint32_t, int> completes;
  for (const vproto::GenerateResponse& r : sink.written()) {
    if (r.has_chunk()) {
      tokens[r.chunk().index()].push_back(r.chunk().token_ids(0));
    } else {
      ++completes[r.complete().index()];
    }
  }
  ASSERT_EQ(tokens.size(), 4u);
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(tokens[i],
              (std::vector<uint32_t>{100 * i, 100 * i + 1, 100 * i + 2}));
    EXPECT_EQ(completes[i], 1);
  }
}

TEST(SampleFanoutTest, AFailedSampleFailsTheRequestOnceAllEnded) {
  RecordingSink sink;
  std::atomic<int> ran{0};
  const grpc::Status s = RunSamples(3, &sink, [&](uint32_t i, Sink*) {
    ++ran;  // sample 0 writes nothing: the others still start
    return i == 2 ? grpc::Status(grpc::StatusCode::INTERNAL, "sample 2")
                  : grpc::Status::OK;
  });
  EXPECT_EQ(ran.load(), 3);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(s.error_message(), "sample 2");
}

}  // namespace
}  // namespace specserve::scheduler::vllm_engine
