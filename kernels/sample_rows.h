// The last step of sampled decoding, as one call: for each of `rows` rows of
// logits in backend memory, the token a sampled request draws. A row is
// filtered as sampling::FilteredProbs defines (temperature, then top-k,
// top-p, min-p; survivors renormalized) and drawn by the inverse CDF at the
// row's uniform (sampling::SampleIndex).
//
// Backend::SampleRows runs exactly those host functions on a copy of each row:
// that is the definition, and what the CPU backend does. A backend may filter
// and draw on the device (the CUDA backend: cuda/sample_rows.cu), copying back
// only the tokens. Its token is the host's except where the order of a long
// floating-point sum moves a cut or the draw across a boundary (relative
// differences of ~1e-16), and it must be deterministic and row-invariant: a
// row's token does not depend on the other rows of the call.
//
// Optionally each row's filtered distribution (the FilteredProbs vector, as
// floats) is written to backend memory as well, with or without a draw: what
// a speculative round's accept step reads (DrawFromProbs below).
//
// Synchronous, like CopyToHost: `token` is filled when the call returns.
#ifndef SPECSERVE_KERNELS_SAMPLE_ROWS_H_
#define SPECSERVE_KERNELS_SAMPLE_ROWS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/sampling/sampling.h"

namespace specserve::kernels {

struct SampleRowsParams {
  int64_t rows = 0;
  int64_t cols = 0;          // the vocabulary
  const float* x = nullptr;  // backend memory; row r's logits start at
  int64_t x_stride = 0;      // x + row_index[r] · x_stride
  // Host arrays of `rows` entries:
  const int32_t* row_index = nullptr;                 // nullptr: row r is r
  const sampling::SamplingConfig* config = nullptr;   // valid, not greedy
  const float* uniform = nullptr;                     // in [0, 1)
  int32_t* token = nullptr;  // out; nullptr: no draw (uniform unused)
  // Optional, backend memory: row r's filtered distribution at
  // probs + r · probs_stride (cols floats).
  float* probs = nullptr;
  int64_t probs_stride = 0;
};

// Params over dense logits [.][cols] at x: row r of the call is x's row
// row_index[r] (row_index nullptr: row r) with configs[r]; the outputs
// (uniform and token, probs) are left for the caller to set.
SampleRowsParams DenseSampleRows(int64_t rows, const float* x, int64_t cols,
                                 const int32_t* row_index,
                                 const sampling::SamplingConfig* configs);

// INVALID_ARGUMENT for sizes, null pointers (token and probs may not both be
// null), a negative row index, a greedy or invalid config, a uniform outside
// [0, 1).
absl::Status Validate(const SampleRowsParams& p);

// One draw from a distribution in backend memory (a row SampleRows wrote):
// from p, or, with `minus`, from the residual max(0, p - minus) (float
// subtraction) where it has mass, else from p: the bonus draw of a rejected
// speculative column (worker/spec/spec_accept.h). The draw is
// sampling::SampleIndex's at `uniform`. Synchronous.
struct DrawFromProbsParams {
  int64_t cols = 0;
  const float* p = nullptr;      // backend memory [cols]
  const float* minus = nullptr;  // backend memory [cols], or nullptr
  float uniform = 0.0f;          // in [0, 1)
  int32_t* token = nullptr;      // host, out
};

absl::Status Validate(const DrawFromProbsParams& p);

// The accept step of a sampled speculative round (rejection sampling) over
// distributions in backend memory: draft i (0-based) is accepted while
// u·q_i(d_i) < p_i(d_i) (float product), u = sampling::Uniform(seed,
// kAccept, uctr + i); at the first rejection, at i, the bonus is
// DrawFromProbs of p_i minus q_i, after all k acceptances DrawFromProbs of
// p_k, either at sampling::Uniform(seed, kSample, sctr). The caller moves
// its counters (worker/spec/spec_accept.h AdvanceSampledCounters). The
// default, the definition, reads the probabilities one by one (a copy each)
// and calls DrawFromProbs; a backend overrides it with one pass on the
// device and one copy back. Synchronous.
constexpr int kMaxAcceptDrafts = 16;
struct AcceptRoundParams {
  int64_t cols = 0;
  int k = 0;                        // drafts, 1..kMaxAcceptDrafts
  const int32_t* drafts = nullptr;  // host [k], each in [0, cols)
  const float* q = nullptr;         // backend memory: q_i at q + i·q_stride
  int64_t q_stride = 0;
  const float* p = nullptr;  // backend memory: p_j (verify column j) at p + j·p_stride
  int64_t p_stride = 0;
  uint64_t seed = 0;
  uint32_t uctr = 0;  // the session's counters before the round
  uint32_t sctr = 0;
  int32_t* accepted = nullptr;  // host, out: n
  int32_t* bonus = nullptr;     // host, out
};

absl::Status Validate(const AcceptRoundParams& p);

}  // namespace specserve::kernels

#endif  // SPECSERVE_KERNELS_SAMPLE_ROWS_H_
