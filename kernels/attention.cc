#include "kernels/attention.h"

#include "kernels/validate.h"

namespace specserve::kernels {

absl::Status Validate(const AttentionParams& p) {
  SS_KERNEL_CHECK(
      p.rows >= 1 && p.num_heads >= 1 && p.num_kv_heads >= 1 && p.head_dim >= 1,
      "attention: empty shape");
  SS_KERNEL_CHECK(p.num_heads % p.num_kv_heads == 0,
                  "attention: num_heads % num_kv_heads != 0");
  const bool batch = p.positions != nullptr;
  SS_KERNEL_CHECK(
      p.q && p.out &&
          (batch ? p.k_caches && p.v_caches : p.k_cache && p.v_cache),
      "attention: null pointer");
  SS_KERNEL_CHECK(p.q_head_stride >= p.head_dim &&
                      p.kv_row_stride >= p.num_kv_heads * p.head_dim &&
                      p.out_row_stride >= p.num_heads * p.head_dim,
                  "attention: stride too small");
  SS_KERNEL_CHECK(!p.gate || p.gate_head_stride >= p.head_dim,
                  "attention: gate stride too small");
  SS_KERNEL_CHECK(batch || (p.first_position >= 0 &&
                            p.first_position + p.rows <= p.capacity),
                  "attention: rows past the cache capacity");
  SS_KERNEL_CHECK(p.kv_dtype == DType::kF32 || p.kv_dtype == DType::kBF16,
                  "attention: the KV cache is fp32 or bf16");
  SS_KERNEL_CHECK(!batch || p.max_position >= 0,
                  "attention: negative max_position");
  return absl::OkStatus();
}

}  // namespace specserve::kernels
