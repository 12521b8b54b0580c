// The three sublayers of a decoder layer, on `rows` rows of the workspace:
// each reads the residual stream ws.h through its layer norm (fused into its
// first matmuls: kernels/matmul.h norm_weight) and adds its output to ws.h
// (the matmul's fused accumulate). Math: docs/MODEL.md.
// The rows may belong to several sessions (Model::Slice, DecodeBatch):
// matmuls and norms run once over all rows (row-invariant, so each row is
// bit-identical to a pass of its session alone); RoPE, attention, conv and
// the delta rule run once per slice on that session's caches, or, for a
// session batch (DecodeBatch: one row per session), once over all rows with
// per-row positions and cache pointers (each row bit-identical to its
// per-slice call). A prefill pass (Mode::kPrefill) runs the matmuls, the
// attention, the conv and the delta rule as the backend's prefill forms, each
// cache op in one call over all slices (Backend::*Slices: each slice's bits
// those of its own call).
#include <cmath>
#include <vector>

#include "glog/logging.h"
#include "telemetry/status_macros.h"
#include "worker/model/model.h"
#include "worker/model/workspace.h"

namespace specserve::model {

using kernels::DenseMatmul;
using kernels::MatmulParams;

namespace {

// The prefill form of the matmul in a prefill pass, else the exact one.
absl::Status MatmulOf(kernels::Backend& be, bool prefill,
                      const MatmulParams& p) {
  return prefill ? be.PrefillMatmul(p) : be.Matmul(p);
}

// y = RmsNorm(h; norm)·Wᵀ, the norm fused into the matmul.
MatmulParams NormedMatmul(int rows, const float* h, const Buffer& norm,
                          float eps, const kernels::Weight& w, float* y) {
  MatmulParams p = DenseMatmul(rows, h, w, y);
  p.norm_weight = norm.f32();
  p.norm_plus_one = true;
  p.norm_eps = eps;
  return p;
}

}  // namespace

absl::Status Model::FullAttentionBlock(const LayerWeights& w,
                                       absl::Span<KvCache* const> kvs,
                                       absl::Span<const Slice> slices,
                                       Mode mode, int rows,
                                       const SessionBatch* batch) {
  const ModelConfig& c = config_;
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads,
                hd = c.head_dim, kv_dim = nkv * hd;
  kernels::Backend& be = *backend_;
  Workspace& ws = *ws_;
  const bool prefill = mode == Mode::kPrefill;
  const AttentionWeights& a = w.attn;
  CHECK_EQ(slices.size(), kvs.size()) << "one cache per slice";
  // One matmul projects every row to [q nh·2·hd | k kv_dim | v kv_dim],
  // W wide; the keys and values go to the caches after k_norm and RoPE.
  const int64_t q_width = nh * 2 * hd, W = q_width + 2 * kv_dim;
  float* const q = ws.qkv.f32();
  SS_RETURN_IF_ERROR(MatmulOf(be, prefill,
                              NormedMatmul(rows, ws.h.f32(), w.input_norm,
                                           c.rms_norm_eps, a.qkv_proj, q)));

  // Per row block (all rows of a session batch, or one slice): q_norm over
  // the query half of every head and k_norm over every key head, RoPE of
  // both, then the keys and values into the cache rows; one AttentionInputs
  // call each. Rows [row0, row0 + n) of the projection:
  auto inputs_of = [&](int64_t row0, int64_t n) {
    kernels::FusedQkvRows r;
    r.rows = n;
    r.heads = nh;
    r.kv_heads = nkv;
    r.head_dim = hd;
    r.rotary_dim = c.rotary_dim();
    r.x = q + row0 * W;
    r.q_norm = a.q_norm.f32();
    r.k_norm = a.k_norm.f32();
    r.eps = c.rms_norm_eps;
    r.inv_freq = weights_.rope_inv_freq.f32();
    return kernels::AttentionInputsOf(r);
  };

  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  kernels::AttentionParams at;
  at.num_heads = nh;
  at.num_kv_heads = nkv;
  at.head_dim = hd;
  at.q_row_stride = W;
  at.q_head_stride = 2 * hd;
  at.gate_row_stride = W;
  at.gate_head_stride = 2 * hd;
  at.kv_row_stride = kv_dim;
  at.kv_dtype = kv_dtype_;
  at.out_row_stride = nh * hd;
  at.scale = scale;
  if (batch != nullptr) {
    // One call per op over all sessions (per-row positions and caches).
    kernels::AttentionInputsParams in = inputs_of(0, rows);
    in.k_scatter.dst_dtype = in.v_scatter.dst_dtype = kv_dtype_;
    in.q_rope.positions = in.k_rope.positions = batch->positions;
    in.k_scatter.dst = batch->k;
    in.v_scatter.dst = batch->v;
    in.k_scatter.dst_rows = in.v_scatter.dst_rows = batch->positions;
    SS_RETURN_IF_ERROR(be.AttentionInputs(in));

    at.rows = rows;
    at.q = q;
    at.gate = q + hd;
    at.out = ws.attn.f32();
    at.positions = batch->positions;
    at.k_caches = batch->k;
    at.v_caches = batch->v;
    at.max_position = batch->max_position;
    SS_RETURN_IF_ERROR(be.Attention(at));
  } else {
    // Every slice's inputs first, then the attention of all slices: slice i
    // writes only its own cache rows [start, start+rows) and reads only its
    // own cache, so the order between slices changes nothing, and the
    // prefill form takes all slices in one call (few launches where many
    // short slices each walk a long history).
    std::vector<kernels::AttentionParams> per_slice(slices.size(), at);
    for (size_t i = 0; i < slices.size(); ++i) {
      const Slice& s = slices[i];
      const KvCache& kv = *kvs[i];
      kernels::AttentionInputsParams in = inputs_of(s.row0, s.rows);
      in.q_rope.first_position = in.k_rope.first_position = s.start;
      in.k_scatter.dst_base = kv.k.data();
      in.v_scatter.dst_base = kv.v.data();
      in.k_scatter.dst_dtype = in.v_scatter.dst_dtype = kv_dtype_;
      in.k_scatter.dst_first_row = in.v_scatter.dst_first_row = s.start;
      SS_RETURN_IF_ERROR(be.AttentionInputs(in));

      kernels::AttentionParams& sa = per_slice[i];
      sa.rows = s.rows;
      sa.q = q + s.row0 * W;
      sa.gate = q + s.row0 * W + hd;
      sa.k_cache = kv.k.data();
      sa.v_cache = kv.v.data();
      sa.capacity = static_cast<int64_t>(kv.k.bytes() / kv_row_bytes());
      sa.first_position = s.start;
      sa.out = ws.attn.f32() + s.row0 * nh * hd;
    }
    if (prefill) {
      SS_RETURN_IF_ERROR(be.PrefillAttentionSlices(per_slice));
    } else {
      for (const kernels::AttentionParams& sa : per_slice) {
        SS_RETURN_IF_ERROR(be.Attention(sa));
      }
    }
  }
  return MatmulOf(be, prefill,
                  DenseMatmul(rows, ws.attn.f32(), a.o_proj, ws.h.f32(),
                              /*accumulate=*/true));
}

absl::Status Model::LinearAttentionBlock(const LayerWeights& w,
                                         absl::Span<LinearCache* const> caches,
                                         absl::Span<const Slice> slices,
                                         Mode mode, int rows,
                                         const SessionBatch* batch) {
  const ModelConfig& c = config_;
  const int64_t nk = c.linear_num_key_heads, nv = c.linear_num_value_heads,
                dk = c.linear_key_head_dim, dv = c.linear_value_head_dim,
                kc = c.linear_conv_kernel_dim, conv_dim = c.conv_dim(),
                key_dim = c.key_dim(), value_dim = c.value_dim();
  kernels::Backend& be = *backend_;
  Workspace& ws = *ws_;
  const bool prefill = mode == Mode::kPrefill;
  const LinearAttentionWeights& l = w.linear;
  // One matmul for qkv, z, b and a: row r of `mixed` is
  // [qkv conv_dim | z value_dim | b nv | a nv], P wide.
  const int64_t P = c.in_proj_dim();
  float* const mixed = ws.mixed.f32();
  const float* const z = mixed + conv_dim;
  const float* const b = z + value_dim;
  const float* const a = b + nv;
  SS_RETURN_IF_ERROR(MatmulOf(be, prefill,
                              NormedMatmul(rows, ws.h.f32(), w.input_norm,
                                           c.rms_norm_eps, l.in_proj, mixed)));

  // Commit: states update in place. Verify: the committed state is only
  // read; the state after column t goes to capture slot t.
  const bool verify = mode == Mode::kVerify;
  CHECK_EQ(slices.size(), caches.size()) << "one cache per slice";
  const int64_t conv_state = conv_dim * (kc - 1);
  const int64_t rec_state = nv * dk * dv;

  // A session batch is one pass with slice-like fields: all rows at once,
  // each on its own states (in place).
  const Slice all{0, rows, 0};
  // The gated norm of each output head of rows [row0, row0 + rows), in place
  // (the delta rule's outputs, value_dim a row).
  auto norm_of = [&](const Slice& s) {
    kernels::GatedRmsNormParams gn;
    gn.rows = s.rows * nv;
    gn.dim = dv;
    gn.x = gn.y = ws.core.f32() + s.row0 * value_dim;
    gn.x_stride = gn.y_stride = dv;
    gn.z = z + s.row0 * P;
    gn.z_stride = dv;
    gn.z_group = nv;  // the nv heads of one token row, rows P apart
    gn.z_group_stride = P;
    gn.weight = l.norm.f32();
    gn.eps = c.rms_norm_eps;
    return gn;
  };
  const size_t passes = batch != nullptr ? 1 : slices.size();
  CHECK(batch == nullptr || !verify) << "a session batch commits";
  // The prefill forms run over all slices at once after the loop (each
  // slice's conv writes only its own conv_out rows and conv state, each
  // rule reads only its own: the order between slices changes nothing).
  std::vector<kernels::Conv1dParams> convs;
  std::vector<kernels::GatedDeltaRuleParams> rules;
  for (size_t i = 0; i < passes; ++i) {
    const Slice& s = batch != nullptr ? all : slices[i];
    LinearCache* cache = batch != nullptr ? nullptr : caches[i];
    float* conv_out = ws.conv_out.f32() + s.row0 * conv_dim;
    kernels::Conv1dParams cv;
    cv.rows = s.rows;
    cv.channels = conv_dim;
    cv.kernel = kc;
    cv.x = mixed + s.row0 * P;
    cv.x_stride = P;
    cv.y = conv_out;
    cv.y_stride = conv_dim;
    cv.weight = l.conv.f32();
    if (batch != nullptr) {
      cv.states = batch->conv;
    } else {
      cv.state_in = cache->conv.f32();
      cv.state_out = verify ? cache->conv_columns.f32() : cache->conv.f32();
      cv.state_out_stride = verify ? conv_state : 0;
    }
    cv.silu = true;

    kernels::GatedDeltaRuleParams g;
    g.rows = s.rows;
    g.num_k_heads = nk;
    g.num_v_heads = nv;
    g.k_head_dim = dk;
    g.v_head_dim = dv;
    g.q = conv_out;
    g.k = conv_out + key_dim;
    g.v = conv_out + 2 * key_dim;
    g.qkv_stride = conv_dim;
    g.a = a + s.row0 * P;
    g.b = b + s.row0 * P;
    g.ab_stride = P;
    g.a_log = l.a_log.f32();
    g.dt_bias = l.dt_bias.f32();
    g.state_dtype = rec_dtype_;
    if (batch != nullptr) {
      g.states = batch->recurrent;
    } else {
      g.state_in = cache->recurrent.data();
      g.state_out =
          verify ? cache->recurrent_columns.data() : cache->recurrent.data();
      g.state_out_stride = verify ? rec_state : 0;
    }
    g.out = ws.core.f32() + s.row0 * value_dim;
    g.out_stride = value_dim;
    g.position = s.start;

    if (prefill) {
      // The rule's prefill form after the conv, whatever the slice's rows (a
      // fused one-row kernel would change the bits); the norm below.
      convs.push_back(cv);
      rules.push_back(g);
    } else {
      // The conv, the rule and the norm: one kernel where the backend can.
      SS_RETURN_IF_ERROR(be.GatedDeltaRuleNormed({g, norm_of(s), cv}));
    }
  }
  if (prefill) {
    SS_RETURN_IF_ERROR(be.Conv1dSlices(convs));
    SS_RETURN_IF_ERROR(be.PrefillGatedDeltaRuleSlices(rules));
    // The gated norm is row by row and the slices' rows are contiguous: one
    // call over every slice's outputs, each row's bits as in its own call.
    SS_RETURN_IF_ERROR(be.GatedRmsNorm(norm_of(all)));
  }
  return MatmulOf(be, prefill,
                  DenseMatmul(rows, ws.core.f32(), l.out_proj, ws.h.f32(),
                              /*accumulate=*/true));
}

absl::Status Model::MlpBlock(const LayerWeights& w, Mode mode, int rows) {
  const int64_t I = config_.intermediate_size;
  kernels::Backend& be = *backend_;
  Workspace& ws = *ws_;
  const bool prefill = mode == Mode::kPrefill;
  float* gate_up = ws.mlp.f32();  // [rows][2I]: gate half then up half
  SS_RETURN_IF_ERROR(
      MatmulOf(be, prefill,
               NormedMatmul(rows, ws.h.f32(), w.post_attention_norm,
                            config_.rms_norm_eps, w.mlp.gate_up, gate_up)));
  // down(silu(gate) ⊙ up), the SwiGLU fused into the matmul's input.
  MatmulParams d = DenseMatmul(rows, gate_up, w.mlp.down_proj, ws.h.f32(),
                               /*accumulate=*/true);
  d.x_stride = 2 * I;
  d.swiglu = true;
  return MatmulOf(be, prefill, d);
}

}  // namespace specserve::model
