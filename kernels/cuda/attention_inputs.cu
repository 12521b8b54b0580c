// AttentionInputs (kernels/attention_inputs.h) in one launch: a warp per
// (row, query or key head) vector normalises it (WarpInvRms and NormedElem,
// rms_inv.cuh: RmsNorm's warp path), rotates its first rotary_dim elements
// (RopePosition and RopeRotate, row_formulas.cuh: RopeKernel's) and writes
// it back in place; a key head's warp also writes the rotated key and the
// same head of the new value into the cache rows ScatterRows would
// (ScatterRowDst, fp32 or rounded to a bf16 cache as ScatterRows stores).
// Every element goes through the same fp32 operations as in the six
// separate ops, so the bits are theirs.
//
// Fused only when the six Params describe that layout (FusesAttentionInputs);
// otherwise the backend runs the six ops.
//
// In place: the whole vector is read before its butterfly returns (by
// WarpInvRms, or into registers on the register path), and afterwards each
// element is read and written by one lane only (lane i % 32 owns the pair
// (i, i + rotary_dim/2) for i < rotary_dim/2 and element i from rotary_dim
// on).
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/rms_inv.cuh"
#include "kernels/cuda/row_formulas.cuh"

namespace specserve::kernels::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kLaneElems = 8;  // the register path: head_dim <= 32 · kLaneElems

// E == 0: the general path (any head_dim and rotary_dim), element by element.
// E > 0 (head_dim <= 32·E, rotary_dim/2 == 32·HS): lane l holds elements l +
// 32e in registers, so the pair (i, i + rotary_dim/2) is slots (e, e + HS) of
// one lane; every load is issued before the first store (one round trip for
// the vector, its weights and the value row, where the general path's
// stores to x order each element's loads behind the last one's).
// The arithmetic per element and the order of the squares' sum are the same
// on both paths.
template <int E, int HS>
__global__ void __launch_bounds__(kWarps * 32)
    AttentionInputsKernel(AttentionInputsParams p) {
  PdlLetNextLaunch();
  const int lane = threadIdx.x & 31;
  const int64_t task =
      static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int64_t qh = p.q_rope.heads, kh = p.k_rope.heads;
  const int64_t t = task / (qh + kh);
  const bool live = t < p.q_rope.rows;
  const int64_t j = task % (qh + kh);
  const bool is_k = j >= qh;
  const int64_t h = is_k ? j - qh : j;
  const RmsNormParams& n = is_k ? p.k_norm : p.q_norm;
  const RopeParams& r = is_k ? p.k_rope : p.q_rope;
  const int64_t dim = n.dim;
  const int64_t half = r.rotary_dim / 2;
  // E > 0: the norm's weights and the rotation's frequencies of the lane's
  // elements, read before the wait: no kernel of a step writes weights
  // (uploads end before any later kernel starts: copy.cu), and these loads,
  // from HBM, would otherwise queue behind the next matmul's weight preload.
  float wv[E > 0 ? E : 1], fv[E > 0 ? E : 1];
  if constexpr (E > 0) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int64_t i = lane + 32 * e;
      wv[e] = live && i < dim ? n.weight[i] : 0.0f;
      fv[e] = live && e < HS ? r.inv_freq[i] : 0.0f;
    }
  }
  PdlWait();  // x, the positions and the caches' rows: after it
  if (!live) return;
  float* x = r.x + t * r.row_stride + h * r.head_stride;
  ScatterRow cache{nullptr, false}, vrow{nullptr, false};
  if (is_k) {
    cache = ScatterRowDst(p.k_scatter, t).At(h * dim);
    vrow = ScatterRowDst(p.v_scatter, t).At(h * dim);
  }
  const float pos = half > 0 ? RopePosition(r, t) : 0.0f;
  const float* v =
      is_k ? p.v_scatter.src + t * p.v_scatter.src_stride + h * dim : nullptr;

  if constexpr (E > 0) {
    float xv[E], vv[E], yv[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int64_t i = lane + 32 * e;
      xv[e] = i < dim ? x[i] : 0.0f;
      vv[e] = is_k && i < dim ? v[i] : 0.0f;
    }
    const float inv = WarpInvRmsOfLane<E>(xv, dim, n.eps, lane);
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int64_t i = lane + 32 * e;
      if (e < HS) {
        // (element i + half is slot e + HS: half == 32·HS)
        const float x1 = NormedElemOf(xv[e], inv, wv[e], n.plus_one);
        const float x2 = NormedElemOf(xv[e + HS], inv, wv[e + HS], n.plus_one);
        RopeRotate(x1, x2, pos, fv[e], &yv[e], &yv[e + HS]);
      } else if (e >= 2 * HS && i < dim) {
        yv[e] = NormedElemOf(xv[e], inv, wv[e], n.plus_one);
      }
    }
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int64_t i = lane + 32 * e;
      if (i < dim) {
        x[i] = yv[e];
        if (is_k) {
          cache.Store(i, yv[e]);
          vrow.Store(i, vv[e]);
        }
      }
    }
  } else {
    const float inv = WarpInvRms(x, dim, n.eps, lane);
    for (int64_t i = lane; i < dim; i += 32) {
      if (i < half) {
        const float x1 = NormedElem(x[i], inv, n.weight, i, n.plus_one);
        const float x2 =
            NormedElem(x[i + half], inv, n.weight, i + half, n.plus_one);
        float y1, y2;
        RopeRotate(x1, x2, pos, r.inv_freq[i], &y1, &y2);
        x[i] = y1;
        x[i + half] = y2;
        if (is_k) {
          cache.Store(i, y1);
          cache.Store(i + half, y2);
        }
      } else if (i >= 2 * half) {
        const float y = NormedElem(x[i], inv, n.weight, i, n.plus_one);
        x[i] = y;
        if (is_k) cache.Store(i, y);
      }
    }
    if (is_k) {
      for (int64_t i = lane; i < dim; i += 32) vrow.Store(i, v[i]);
    }
  }
}

// The norm covers exactly the rope's head vectors, in place.
bool NormMatchesRope(const RmsNormParams& n, const RopeParams& r) {
  return n.y == n.x && n.x == r.x && n.y_stride == n.x_stride &&
         n.y_group_stride == n.x_group_stride && n.group == r.heads &&
         n.x_stride == r.head_stride && n.x_group_stride == r.row_stride &&
         n.rows == r.rows * r.heads && n.dim == r.head_dim &&
         n.dim < kRmsBlockDim;
}

}  // namespace

bool FusesAttentionInputs(const AttentionInputsParams& p) {
  const RopeParams& q = p.q_rope;
  const RopeParams& k = p.k_rope;
  const ScatterRowsParams& ks = p.k_scatter;
  const ScatterRowsParams& vs = p.v_scatter;
  return NormMatchesRope(p.q_norm, q) && NormMatchesRope(p.k_norm, k) &&
         q.rows == k.rows && k.head_stride == k.head_dim &&
         // the key scatter copies the rotated keys, heads back to back
         ks.src == k.x && ks.src_stride == k.row_stride && ks.rows == k.rows &&
         ks.cols == k.heads * k.head_dim &&
         // the value scatter: the same row and column layout
         vs.rows == k.rows && vs.cols == ks.cols;
}

absl::Status LaunchAttentionInputs(const AttentionInputsParams& p,
                                   cudaStream_t stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (!FusesAttentionInputs(p)) {
    return absl::InvalidArgumentError(
        "attention_inputs: the six ops do not fuse");
  }
  const int64_t tasks = p.q_rope.rows * (p.q_rope.heads + p.k_rope.heads);
  const int64_t blocks = CeilDiv(tasks, kWarps);
  if (blocks > 0x7fffffff)
    return absl::InvalidArgumentError("attention_inputs: too many rows");
  const dim3 grid(static_cast<unsigned>(blocks)), block(kWarps * 32);
  const int64_t half = p.q_rope.rotary_dim / 2;
  const bool regs = std::max(p.q_norm.dim, p.k_norm.dim) <= 32 * kLaneElems &&
                    p.k_rope.rotary_dim / 2 == half && half % 32 == 0;
  switch (regs ? half / 32 : -1) {
    case 0:
      LaunchPdl(AttentionInputsKernel<kLaneElems, 0>, grid, block, 0, stream,
                p);
      break;
    case 1:
      LaunchPdl(AttentionInputsKernel<kLaneElems, 1>, grid, block, 0, stream,
                p);
      break;
    case 2:
      LaunchPdl(AttentionInputsKernel<kLaneElems, 2>, grid, block, 0, stream,
                p);
      break;
    case 3:
      LaunchPdl(AttentionInputsKernel<kLaneElems, 3>, grid, block, 0, stream,
                p);
      break;
    case 4:
      LaunchPdl(AttentionInputsKernel<kLaneElems, 4>, grid, block, 0, stream,
                p);
      break;
    default:
      LaunchPdl(AttentionInputsKernel<0, 0>, grid, block, 0, stream, p);
      break;
  }
  return LaunchStatus("attention_inputs launch");
}

}  // namespace specserve::kernels::cuda
