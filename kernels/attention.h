// Causal softmax attention of T new query rows over a KV cache, with GQA and
// the optional sigmoid output gate of gated attention:
//   row t (position p = first_position + t) attends cache rows 0..p inclusive;
//   head h reads kv head h / (num_heads / num_kv_heads);
//   out[t][h] = Σ_r softmax_r(scale·q·k_r) v_r  (⊙ sigmoid(gate[t][h]) if gate)
// The cache rows first_position..first_position+T−1 must already hold this
// call's keys and values. Each output row is computed by the same sequence
// of operations whatever T is (verify == decode), and rows never read cache
// rows past their own position.
//
// Session batch (positions != nullptr; DecodeBatch): the rows belong to
// different sessions, one row each. Row t is at position positions[t] and
// attends rows 0..positions[t] of its own caches k_caches[t] / v_caches[t]
// (which already hold its key and value); k_cache, v_cache, first_position
// and capacity are unused. The arrays live in backend memory; every
// positions[t] must be <= max_position (which sizes the launch). Row t is
// bit-identical to a one-row call at first_position = positions[t].
//
// The caches hold kv_dtype elements: fp32, or bf16 (half the bytes; its
// values are the fp32 keys and values rounded to nearest even when written,
// kernels/scatter_rows.h, and are read back exactly).
#ifndef SPECSERVE_KERNELS_ATTENTION_H_
#define SPECSERVE_KERNELS_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/types.h"

namespace specserve::kernels {

struct AttentionParams {
  int64_t rows = 0;  // T
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  const float* q = nullptr;
  int64_t q_row_stride = 0;
  int64_t q_head_stride = 0;
  const float* gate = nullptr;  // optional, layout like q
  int64_t gate_row_stride = 0;
  int64_t gate_head_stride = 0;
  const void* k_cache = nullptr;  // [capacity][kv_row_stride] kv_dtype
  const void* v_cache = nullptr;  // [capacity][kv_row_stride] kv_dtype
  int64_t kv_row_stride = 0;      // elements; kv head j at j·head_dim
  DType kv_dtype = DType::kF32;   // kF32 or kBF16
  int64_t capacity = 0;           // rows of the cache
  int64_t first_position = 0;
  float* out = nullptr;  // [T][out_row_stride], head h at h·head_dim
  int64_t out_row_stride = 0;
  float scale = 1.0f;
  // Session batch (see above); all three arrays [rows], backend memory.
  const int32_t* positions = nullptr;
  const void* const* k_caches = nullptr;
  const void* const* v_caches = nullptr;
  int64_t max_position = 0;
};

absl::Status Validate(const AttentionParams& p);

}  // namespace specserve::kernels

#endif  // SPECSERVE_KERNELS_ATTENTION_H_
