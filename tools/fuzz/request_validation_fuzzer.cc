// libFuzzer target: the scheduler's admission path for a Generate request
// from its wire bytes (scheduler/public_services.cc HandleGenerate):
// ParseRequest, then ValidateGenerateRequest, then the checks that follow
// tokenizing and session lookup (ValidatePromptLength, ValidateSessionTurn,
// ValidateSessionCapacity). Besides "no crash, no sanitizer report" it checks
// what the headers promise:
//  - ParseRequest answers OK or INVALID_ARGUMENT with a message, and its
//    ByteBuffer overload (the bytes as gRPC hands them over, in several
//    slices) agrees with the string one, message for message;
//  - every refusal is INVALID_ARGUMENT (OUT_OF_RANGE for a session turn)
//    with a non-empty message;
//  - a request that validates respects every bound of Limits, and its
//    sampling parameters are ones the worker accepts (worker_service.cc
//    SamplingOf: top_p 0 read as 1, then sampling::ValidateSamplingConfig),
//    and so are its logit controls (sampling::ValidateLogitAdjustments):
//    the scheduler forwards them to the worker unchanged;
//  - ValidatePromptLength / ValidateSessionTurn accept exactly when the rows
//    fit;
//  - an accepted structured_output has a kind, a non-empty choice list and
//    at most kMaxGrammarTextBytes of grammar text.
// Input: arbitrary bytes, parsed as specserve.v1.GenerateRequest.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "kernels/sampling/logit_adjust.h"
#include "kernels/sampling/sampling.h"
#include "proto/api_limits.h"
#include "proto/specserve.pb.h"
#include "scheduler/request_parsing.h"
#include "scheduler/request_validation.h"

namespace {

namespace v1 = specserve::v1;
using specserve::scheduler::Limits;

#define FUZZ_CHECK(cond, ...)                                 \
  do {                                                        \
    if (!(cond)) {                                            \
      std::fprintf(stderr, "FUZZ_CHECK failed: %s: ", #cond); \
      std::fprintf(stderr, __VA_ARGS__);                      \
      std::fprintf(stderr, "\n");                             \
      std::abort();                                           \
    }                                                         \
  } while (0)

// The limits a scheduler runs with: the default model's (vocab 6144,
// context 4096), tests/models/tiny_a's (317, 1024), and a degenerate model
// whose context is exactly the smallest session capacity.
Limits MakeLimits(uint32_t vocab, uint32_t context) {
  Limits l;
  l.vocab_size = vocab;
  l.max_context = context;
  return l;
}
const Limits kLimits[] = {MakeLimits(6144, 4096), MakeLimits(317, 1024),
                          MakeLimits(1, 10)};

void CheckRefusal(const absl::Status& s, absl::StatusCode want,
                  const char* what) {
  FUZZ_CHECK(s.code() == want, "%s: %s", what, s.ToString().c_str());
  FUZZ_CHECK(!s.message().empty(), "%s: refusal without a message", what);
}

// ParseRequest on a grpc::ByteBuffer of `bytes` cut into up to three slices.
absl::Status ParseAsGrpc(absl::string_view bytes, v1::GenerateRequest* out) {
  const size_t a = bytes.size() / 3, b = 2 * bytes.size() / 3;
  grpc::Slice slices[3] = {
      grpc::Slice(bytes.data(), a),
      grpc::Slice(bytes.data() + a, b - a),
      grpc::Slice(bytes.data() + b, bytes.size() - b),
  };
  grpc::ByteBuffer raw(slices, 3);
  return specserve::scheduler::ParseRequest(&raw, out);
}

std::string DeterministicBytes(const v1::GenerateRequest& req) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    req.SerializeToCodedStream(&coded);
  }
  return out;
}

// What a validated request promises the rest of the scheduler and the worker.
void CheckAccepted(const v1::GenerateRequest& req, const Limits& l) {
  const bool continuation = specserve::scheduler::IsSessionContinuation(req);
  FUZZ_CHECK(req.request_id().size() <= l.max_request_id_len, "request_id");
  switch (req.input_case()) {
    case v1::GenerateRequest::INPUT_NOT_SET:
      FUZZ_CHECK(continuation, "no input accepted on a new session");
      break;
    case v1::GenerateRequest::kText:
      FUZZ_CHECK(!req.text().empty() || continuation, "empty text accepted");
      FUZZ_CHECK(req.text().size() <= l.max_text_bytes, "text too long");
      break;
    case v1::GenerateRequest::kTokenIds: {
      const auto& ids = req.token_ids().ids();
      FUZZ_CHECK(!ids.empty() || continuation, "empty token_ids accepted");
      for (uint32_t id : ids) {
        FUZZ_CHECK(id < l.vocab_size, "token id %u >= vocab %u", id,
                   l.vocab_size);
      }
      // The prompt length is known: it was checked against the context.
      FUZZ_CHECK(
          static_cast<uint64_t>(ids.size()) + req.stopping().max_tokens() <=
              l.max_context,
          "prompt + max_tokens over the context");
      break;
    }
  }
  const v1::SamplingParams& s = req.sampling();
  FUZZ_CHECK(std::isfinite(s.temperature()) && s.temperature() >= 0,
             "temperature %g", s.temperature());
  FUZZ_CHECK(s.top_k() <= l.vocab_size, "top_k");
  // The worker's reading of the same parameters (worker_service.cc
  // SamplingOf) must accept them: the scheduler forwards them unchanged.
  specserve::sampling::SamplingConfig c;
  c.temperature = s.temperature();
  c.top_k = static_cast<int>(s.top_k());
  c.top_p = s.top_p() == 0.0f ? 1.0f : s.top_p();
  c.min_p = s.min_p();
  const absl::Status worker = specserve::sampling::ValidateSamplingConfig(c);
  FUZZ_CHECK(worker.ok(),
             "scheduler accepted sampling the worker refuses: %s "
             "(temperature %g top_k %u top_p %g min_p %g)",
             worker.ToString().c_str(), s.temperature(), s.top_k(), s.top_p(),
             s.min_p());

  // The logit controls as the worker reads them (worker/burst_request.cc:
  // repetition 0 read as 1; the stop ids min_tokens masks are the
  // request's, checked below).
  specserve::sampling::LogitAdjustments a;
  a.presence_penalty = s.presence_penalty();
  a.frequency_penalty = s.frequency_penalty();
  a.repetition_penalty =
      s.repetition_penalty() == 0.0f ? 1.0f : s.repetition_penalty();
  for (const auto& [id, bias] : s.logit_bias()) {
    a.logit_bias.emplace_back(static_cast<int32_t>(id), bias);
  }
  a.min_tokens = static_cast<int>(std::min<uint32_t>(
      req.stopping().min_tokens(), static_cast<uint32_t>(INT32_MAX)));
  const absl::Status controls = specserve::sampling::ValidateLogitAdjustments(
      a, static_cast<int>(l.vocab_size));
  FUZZ_CHECK(controls.ok(),
             "scheduler accepted logit controls the worker refuses: %s",
             controls.ToString().c_str());

  if (req.has_structured_output()) {
    const v1::StructuredOutput& so = req.structured_output();
    size_t bytes = so.json_schema().size() + so.regex().size() +
                   so.ebnf().size();
    for (const std::string& c : so.choice().values()) bytes += c.size();
    FUZZ_CHECK(so.kind_case() != v1::StructuredOutput::KIND_NOT_SET,
               "structured_output without a kind accepted");
    FUZZ_CHECK(bytes <= specserve::kMaxGrammarTextBytes,
               "grammar text of %zu bytes accepted", bytes);
    FUZZ_CHECK(so.kind_case() != v1::StructuredOutput::kChoice ||
                   so.choice().values_size() > 0,
               "empty choice accepted");
  }

  const v1::StoppingParams& st = req.stopping();
  FUZZ_CHECK(st.max_tokens() <= l.max_context, "max_tokens");
  FUZZ_CHECK(st.max_tokens() == 0 || st.min_tokens() <= st.max_tokens(),
             "min_tokens %u over max_tokens %u", st.min_tokens(),
             st.max_tokens());
  FUZZ_CHECK(static_cast<uint32_t>(st.stop_size()) <= l.max_stop_strings,
             "stop count");
  for (const std::string& stop : st.stop()) {
    FUZZ_CHECK(!stop.empty() && stop.size() <= l.max_stop_len, "stop string");
  }
  FUZZ_CHECK(
      static_cast<uint32_t>(st.stop_token_ids_size()) <= l.max_stop_token_ids,
      "stop_token_ids count");
  for (uint32_t id : st.stop_token_ids()) {
    FUZZ_CHECK(id < l.vocab_size, "stop token id");
  }
  FUZZ_CHECK(
      req.speculation().k() <= static_cast<uint32_t>(specserve::kMaxDraftDepth),
      "speculation.k");
  if (req.has_session()) {
    const v1::SessionTurn& t = req.session();
    FUZZ_CHECK(t.session_id().size() <= l.max_session_id_len, "session_id");
    FUZZ_CHECK(t.mode() == v1::SessionTurn::APPEND ||
                   t.mode() == v1::SessionTurn::REWIND,
               "session.mode %d", static_cast<int>(t.mode()));
    if (t.session_id().empty()) {
      FUZZ_CHECK(t.mode() != v1::SessionTurn::REWIND, "REWIND without id");
      const uint32_t cap = t.capacity();
      FUZZ_CHECK(
          cap == 0 || (cap >= specserve::scheduler::MinSessionCapacity() &&
                       cap <= l.max_context),
          "session.capacity %u accepted", cap);
    }
  }
}

// The arithmetic checks, on numbers taken from the request.
void CheckArithmetic(const v1::GenerateRequest& req, const Limits& l) {
  const uint64_t prompt = req.input_case() == v1::GenerateRequest::kTokenIds
                              ? req.token_ids().ids_size()
                              : req.text().size();
  const uint32_t max_tokens = req.stopping().max_tokens();
  const absl::Status p =
      specserve::scheduler::ValidatePromptLength(prompt, max_tokens, l);
  if (prompt + max_tokens <= l.max_context) {
    FUZZ_CHECK(p.ok(), "prompt fits but: %s", p.ToString().c_str());
  } else {
    CheckRefusal(p, absl::StatusCode::kInvalidArgument, "ValidatePromptLength");
  }

  const uint32_t capacity = req.session().capacity();
  const absl::Status cs = specserve::scheduler::ValidateSessionCapacity(
      capacity, l, "session.capacity");
  if (capacity == 0 ||
      (capacity >= specserve::scheduler::MinSessionCapacity() &&
       capacity <= l.max_context)) {
    FUZZ_CHECK(cs.ok(), "capacity %u: %s", capacity, cs.ToString().c_str());
  } else {
    CheckRefusal(cs, absl::StatusCode::kInvalidArgument,
                 "ValidateSessionCapacity");
  }

  // A turn on a session of `capacity` rows with `committed` rows in it.
  const uint64_t committed = req.sampling().top_k();
  const absl::Status t = specserve::scheduler::ValidateSessionTurn(
      committed, prompt, max_tokens, capacity);
  if (committed + prompt + max_tokens <= capacity) {
    FUZZ_CHECK(t.ok(), "turn fits but: %s", t.ToString().c_str());
  } else {
    CheckRefusal(t, absl::StatusCode::kOutOfRange, "ValidateSessionTurn");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // protobuf logs every string field that is not UTF-8 (ERROR): quiet.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  v1::GenerateRequest req;
  const absl::Status parsed = specserve::scheduler::ParseRequest(bytes, &req);
  v1::GenerateRequest via_grpc;
  const absl::Status parsed_grpc = ParseAsGrpc(bytes, &via_grpc);
  FUZZ_CHECK(parsed == parsed_grpc,
             "ParseRequest(string) %s != ParseRequest(ByteBuffer) %s",
             parsed.ToString().c_str(), parsed_grpc.ToString().c_str());
  if (!parsed.ok()) {
    CheckRefusal(parsed, absl::StatusCode::kInvalidArgument, "ParseRequest");
    return 0;
  }
  // Bytes, not MessageDifferencer: a NaN float is unequal to itself. The
  // serialization is the deterministic one: a map's default order follows
  // each instance's hash table, so equal maps may print differently.
  FUZZ_CHECK(DeterministicBytes(req) == DeterministicBytes(via_grpc),
             "the two ParseRequest overloads parsed different messages");

  for (const Limits& l : kLimits) {
    const absl::Status v =
        specserve::scheduler::ValidateGenerateRequest(req, l);
    if (v.ok()) {
      CheckAccepted(req, l);
    } else {
      CheckRefusal(v, absl::StatusCode::kInvalidArgument,
                   "ValidateGenerateRequest");
    }
    CheckArithmetic(req, l);
  }
  return 0;
}
