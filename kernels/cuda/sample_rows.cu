// Sampled decoding on the device (kernels/sample_rows.h): each row's logits
// filtered as sampling::FilteredProbs defines and drawn as
// sampling::SampleIndex does; only the tokens go back to the host.
//
// Four kernels per call, in stream order:
//  1. StatsKernel (kSlices blocks per row): each slice's max and finiteness.
//  2. ExpKernel (kSlices blocks per row): the row's max from its slices',
//     e_i = exp(double(x_i - max) / T) into scratch (double, as the host
//     computes it), and each slice's sum of e in a fixed order.
//  3. NormKernel: total = the slices' sums in slice order; p_i = e_i / total.
//  4. DrawKernel (one block per row):
//     - temperature and min-p only: DrawFromPrefix over the whole row (the
//       kept mass, a fixed-order block sum; probs_i = float(p_i / kept); the
//       inverse CDF over contiguous per-thread chunks: chunk sums, a block
//       scan, and the one thread whose chunk holds the target walks it as the
//       host walks the row);
//     - top-k or top-p: DrawOrdered: the first kMaxSampleCandidates ids of
//       the filters' order (a radix select on fl(max - x_i), whose order is
//       p's, and a compaction that keeps ties in ascending id), sorted in
//       shared memory; one thread runs the host's loops (nucleus, min-p,
//       kept mass; the draw in id order) over them in the host's order, so
//       those sums are the host's;
//     - past the candidates, a prefix of the order found without sorting
//       it, then DrawFromPrefix: a top-k above them by the same radix
//       select; a nucleus (of the whole row, or of such a top-k's
//       renormalized mass) by a search of the key whose prefix mass reaches
//       top_p (NucleusCut).
// The differences from the host are the orders of the long sums (the softmax
// total, a kept mass or nucleus mass over the row, the draw's running mass
// over the row), ~1e-16 relative: a token moves only when the uniform falls
// that close to a boundary. Each row's work depends on its own logits, config
// and uniform alone (row invariant), and every sum has a fixed order
// (deterministic).
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"

namespace specserve::kernels::cuda {
namespace {

constexpr int kSlices = 16;  // blocks per row in the max and exp passes
constexpr int kSliceThreads = 256;
constexpr int kThreads = 1024;  // DrawKernel: one thread per candidate
static_assert(kMaxSampleCandidates == kThreads,
              "the sorts hold one candidate per thread");
constexpr int kWarps = kThreads / 32;

struct Scratch {
  float* slice_max;   // [rows][kSlices]
  int* slice_finite;  // [rows][kSlices]
  double* slice_sum;  // [rows][kSlices]
  double* p;          // [rows][cols]: e_i, then p_i = e_i / total
};

inline size_t AlignUp(size_t n) { return (n + 255) / 256 * 256; }

// Where each part of the scratch starts, from `base`; *bytes: the whole.
inline Scratch ScratchAt(void* base, int64_t rows, int64_t cols,
                         size_t* bytes = nullptr) {
  size_t at = 0;
  auto take = [&](size_t n) {
    void* p = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(base) + at);
    at += AlignUp(n);
    return p;
  };
  Scratch s;
  s.slice_max = static_cast<float*>(take(sizeof(float) * rows * kSlices));
  s.slice_finite = static_cast<int*>(take(sizeof(int) * rows * kSlices));
  s.slice_sum = static_cast<double*>(take(sizeof(double) * rows * kSlices));
  s.p = static_cast<double*>(take(sizeof(double) * rows * cols));
  if (bytes != nullptr) *bytes = at;
  return s;
}

size_t ScratchBytes(int64_t rows, int64_t cols) {
  size_t bytes = 0;
  ScratchAt(nullptr, rows, cols, &bytes);
  return bytes;
}

// [lo, hi): part `part` of `parts` equal contiguous ranges of [0, cols).
__device__ inline void PartRange(int64_t cols, int parts, int part, int64_t* lo,
                                 int64_t* hi) {
  const int64_t len = (cols + parts - 1) / parts;
  *lo = part * len;
  *hi = *lo + len < cols ? *lo + len : cols;
}

// Inclusive prefix sums over the block in thread order (a fixed tree: warp
// shuffles, then the warp totals), into incl[threadIdx.x].
template <typename T>
__device__ void BlockInclusiveScan(T v, T* incl, T* warp_sums) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const T o = __shfl_up_sync(kFullMask, v, d);
    if (lane >= d) v += o;
  }
  __syncthreads();
  if (lane == 31) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < kWarps ? warp_sums[lane] : T(0);
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const T o = __shfl_up_sync(kFullMask, w, d);
      if (lane >= d) w += o;
    }
    warp_sums[lane] = w;
  }
  __syncthreads();
  incl[threadIdx.x] = warp > 0 ? v + warp_sums[warp - 1] : v;
  __syncthreads();
}

// Ascending bitonic sort of kThreads keys, one per thread.
__device__ void BitonicSort(uint64_t* a) {
  const int t = threadIdx.x;
  for (int k = 2; k <= kThreads; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      const int o = t ^ j;
      if (o > t) {
        const bool up = (t & k) == 0;
        const uint64_t x = a[t], y = a[o];
        if ((x > y) == up) {
          a[t] = y;
          a[o] = x;
        }
      }
      __syncthreads();
    }
  }
}

__global__ void __launch_bounds__(kSliceThreads)
    StatsKernel(const SampleRowArgs* args, const float* x, int64_t cols,
                Scratch s) {
  const int row = blockIdx.x / kSlices, slice = blockIdx.x % kSlices;
  const float* xr = x + args[row].x_offset;
  int64_t lo, hi;
  PartRange(cols, kSlices, slice, &lo, &hi);
  float m = -INFINITY;
  int finite = 1;
  for (int64_t i = lo + threadIdx.x; i < hi; i += kSliceThreads) {
    const float v = xr[i];
    // -inf is a masked token (kernels/token_mask.h): probability 0.
    finite &= (isnan(v) || v == INFINITY) ? 0 : 1;
    m = fmaxf(m, v);
  }
  __shared__ float sm[kSliceThreads / 32];
  m = WarpMax(m);
  if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = m;
  finite = __syncthreads_and(finite);
  if (threadIdx.x == 0) {
    for (int w = 0; w < kSliceThreads / 32; ++w) m = fmaxf(m, sm[w]);
    s.slice_max[blockIdx.x] = m;
    s.slice_finite[blockIdx.x] = finite;
  }
}

// The row's max and finiteness from its slices' (max is exact in any order).
__device__ inline bool RowStats(const Scratch& s, int row, float* max) {
  float m = -INFINITY;
  bool finite = true;
  for (int j = 0; j < kSlices; ++j) {
    m = fmaxf(m, s.slice_max[row * kSlices + j]);
    finite = finite && s.slice_finite[row * kSlices + j] != 0;
  }
  *max = m;
  return finite;
}

__global__ void __launch_bounds__(kSliceThreads)
    ExpKernel(const SampleRowArgs* args, const float* x, int64_t cols,
              Scratch s) {
  const int row = blockIdx.x / kSlices, slice = blockIdx.x % kSlices;
  float m;
  if (!RowStats(s, row, &m)) return;
  const float* xr = x + args[row].x_offset;
  double* er = s.p + row * cols;
  // As the host: the difference in float, then double.
  const double t = static_cast<double>(args[row].temperature);
  int64_t lo, hi;
  PartRange(cols, kSlices, slice, &lo, &hi);
  double acc = 0.0;
  for (int64_t i = lo + threadIdx.x; i < hi; i += kSliceThreads) {
    const double e = exp(static_cast<double>(__fsub_rn(xr[i], m)) / t);
    er[i] = e;
    acc += e;
  }
  __shared__ double sm[kSliceThreads / 32];
  acc = BlockSumD<kSliceThreads>(acc, sm);
  if (threadIdx.x == 0) s.slice_sum[blockIdx.x] = acc;
}

__device__ inline double RowTotal(const Scratch& s, int row) {
  double total = 0.0;
  for (int j = 0; j < kSlices; ++j) total += s.slice_sum[row * kSlices + j];
  return total;
}

// p_i = e_i / total in place, as the host divides.
__global__ void __launch_bounds__(kSliceThreads)
    NormKernel(int64_t cols, Scratch s) {
  const int row = blockIdx.x / kSlices, slice = blockIdx.x % kSlices;
  float m;
  if (!RowStats(s, row, &m)) return;
  const double total = RowTotal(s, row);
  double* pr = s.p + row * cols;
  int64_t lo, hi;
  PartRange(cols, kSlices, slice, &lo, &hi);
  for (int64_t i = lo + threadIdx.x; i < hi; i += kSliceThreads)
    pr[i] = pr[i] / total;
}

struct DrawShared {
  double incl[kThreads];  // scans; then the candidates' p
  double warp_d[32];
  int incl_i[kThreads];
  int warp_i[32];
  int hist[256];
  uint64_t keys[kThreads];
  double term[kThreads];
  float probs[kThreads];
  uint32_t select_prefix;
  int select_need;
  int keep;
  int fallback;
  double kept;
  int walker_token;
  int tie_count;
  int tie_index;
};

// The filters' order: p descending is fl(max - x) ascending (the host's
// p = exp(fl(x - max) / T) / total, and fl(max - x) = -fl(x - max)); ties
// by id ascending. Both are non-negative floats, so their bits order them.
__device__ inline uint32_t OrderKey(const float* xr, int64_t i, float row_max) {
  return __float_as_uint(__fsub_rn(row_max, xr[i]));
}

// A prefix of the filters' order: the ids whose key is below `key`, then the
// first `ties` ids (ascending) whose key equals it; or the whole row.
struct OrderCut {
  uint32_t key = 0xffffffffu;
  int ties = 0;
  bool whole_row = true;
};

// The inverse CDF over a row of float probabilities in contiguous per-thread
// chunks (ids ascend with the threads), as sampling::SampleIndex walks the
// row: chunk sums, a block scan, and the one thread whose chunk holds
// u · total walks it; a target past the total (rounding) takes the row's
// last nonzero. prob(i, &state) is called for every id of a chunk in order,
// state starting at `init` each time.
template <typename State, typename Prob>
__device__ int InverseCdf(float uniform, int64_t lo, int64_t hi, State init,
                          Prob prob, DrawShared& sh) {
  const int t = threadIdx.x;
  double mass = 0.0;
  int last = -1;
  State state = init;
  for (int64_t i = lo; i < hi; ++i) {
    const float f = prob(i, &state);
    if (f > 0.0f) {
      mass += f;
      last = static_cast<int>(i);
    }
  }
  BlockInclusiveScan(mass, sh.incl, sh.warp_d);
  const double target = static_cast<double>(uniform) * sh.incl[kThreads - 1];
  if (t == 0) sh.walker_token = -1;
  __syncthreads();
  const bool here =
      target < sh.incl[t] && (t == 0 || !(target < sh.incl[t - 1]));
  if (here) {
    double cum = t > 0 ? sh.incl[t - 1] : 0.0;
    int token = last;  // (rounding: the chunk's own last nonzero)
    state = init;
    for (int64_t i = lo; i < hi; ++i) {
      const float f = prob(i, &state);
      if (f <= 0.0f) continue;
      cum += f;
      if (target < cum) {
        token = static_cast<int>(i);
        break;
      }
    }
    sh.walker_token = token;
  }
  int row_last = last;
#pragma unroll
  for (int m = 16; m > 0; m >>= 1)
    row_last = max(row_last, __shfl_xor_sync(kFullMask, row_last, m));
  __syncthreads();
  if ((t & 31) == 0) sh.warp_i[t >> 5] = row_last;
  __syncthreads();
  const int walked = sh.walker_token;
  int r = -1;
  for (int w = 0; w < kWarps; ++w) r = max(r, sh.warp_i[w]);
  __syncthreads();  // (sh is reused by the caller)
  return walked >= 0 ? walked : r;
}

// The draw over a prefix of the order (the whole row; a top-k above the
// candidates; a nucleus past them), with min-p: a kept set that needs no
// order. The kept mass is a fixed-order block sum; the inverse CDF runs over
// contiguous per-thread chunks (ids ascend with the threads): chunk sums, a
// block scan, and the one thread whose chunk holds the target walks it as
// the host walks the row.
__device__ int DrawFromPrefix(const SampleRowArgs& a, const float* xr,
                              const double* pr, int64_t cols, float row_max,
                              double total, const OrderCut& cut,
                              DrawShared& sh) {
  const int t = threadIdx.x;
  // The largest p is the max's: e = exp(0) = 1.
  const double threshold =
      a.min_p > 0.0f ? static_cast<double>(a.min_p) * (1.0 / total) : 0.0;
  int64_t lo, hi;
  PartRange(cols, kThreads, t, &lo, &hi);
  // The cut's ties in the chunks before this one.
  int tie_base = 0;
  if (!cut.whole_row) {
    int mine = 0;
    for (int64_t i = lo; i < hi; ++i)
      mine += OrderKey(xr, i, row_max) == cut.key;
    BlockInclusiveScan(mine, sh.incl_i, sh.warp_i);
    tie_base = sh.incl_i[t] - mine;
  }
  // Called for every id of the chunk in order: `rank` counts the ties met.
  auto member = [&](int64_t i, int* rank) {
    if (cut.whole_row) return true;
    const uint32_t k = OrderKey(xr, i, row_max);
    if (k < cut.key) return true;
    return k == cut.key && (*rank)++ < cut.ties;
  };
  double acc = 0.0;
  int rank = tie_base;
  for (int64_t i = lo; i < hi; ++i) {
    const bool in = member(i, &rank);
    const double p = pr[i];
    if (in && p >= threshold) acc += p;
  }
  const double kept = BlockSumD<kThreads>(acc, sh.warp_d);
  auto prob = [&](int64_t i, int* rank) {
    const bool in = member(i, rank);
    const double p = pr[i];
    return in && p >= threshold ? static_cast<float>(p / kept) : 0.0f;
  };
  return InverseCdf(a.uniform, lo, hi, tie_base, prob, sh);
}

// The first `want` ids of the order (want <= cols) as a cut: a radix select
// of the want-th key, 8 bits a pass (one add per distinct bin per warp:
// logits crowd a few bins).
__device__ OrderCut SelectFirst(int want, const float* xr, int64_t cols,
                                float row_max, DrawShared& sh) {
  const int t = threadIdx.x;
  if (t == 0) {
    sh.select_prefix = 0;
    sh.select_need = want;
  }
  uint32_t mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    if (t < 256) sh.hist[t] = 0;
    __syncthreads();
    const uint32_t prefix = sh.select_prefix;
    for (int64_t i = t; i < cols; i += kThreads) {
      const uint32_t k = OrderKey(xr, i, row_max);
      if ((k & mask) == prefix) {
        const unsigned bin = (k >> shift) & 255;
        const unsigned peers = __match_any_sync(__activemask(), bin);
        if ((threadIdx.x & 31) == __ffs(peers) - 1)
          atomicAdd(&sh.hist[bin], __popc(peers));
      }
    }
    __syncthreads();
    if (t == 0) {
      int below = 0, b = 0;
      while (below + sh.hist[b] < sh.select_need) below += sh.hist[b++];
      sh.select_need -= below;
      sh.select_prefix = prefix | (static_cast<uint32_t>(b) << shift);
    }
    mask |= 255u << shift;
    __syncthreads();
  }
  OrderCut cut;
  cut.key = sh.select_prefix;
  cut.ties = sh.select_need;  // >= 1
  cut.whole_row = false;
  __syncthreads();  // (sh.select_* are rewritten by the next select)
  return cut;
}

// Over one row, against `key`: the block sum of term(i) over the ids whose
// key is below it (a fixed order), and the ids at it: their count and the
// highest (equal keys: equal p, so any one gives their term). All threads
// call it; it leaves sh.tie_count and sh.tie_index set (two barriers).
struct KeyTally {
  double below;
  int ties;
  int tie_index;  // -1 when no id has the key
};
template <typename Term>
__device__ KeyTally TallyKey(const float* xr, int64_t cols, float row_max,
                             uint32_t key, Term&& term, DrawShared& sh) {
  const int t = threadIdx.x;
  double below = 0.0;
  int ties = 0, tie_index = -1;
  for (int64_t i = t; i < cols; i += kThreads) {
    const uint32_t k = OrderKey(xr, i, row_max);
    if (k < key) below += term(i);
    if (k == key) {
      ++ties;
      tie_index = static_cast<int>(i);
    }
  }
  below = BlockSumD<kThreads>(below, sh.warp_d);
  if (t == 0) {
    sh.tie_count = 0;
    sh.tie_index = -1;
  }
  __syncthreads();
  if (ties > 0) {  // (counts and a max: the same in any order)
    atomicAdd(&sh.tie_count, ties);
    atomicMax(&sh.tie_index, tie_index);
  }
  __syncthreads();
  return KeyTally{below, sh.tie_count, sh.tie_index};
}

// The nucleus past the candidates, within the prefix `limit` of the order
// (a top-k cut, or the whole row) whose mass is `kept_mass` (1 for the
// whole row): the smallest key K whose prefix mass (keys <= K, each term
// p / kept_mass as the host divides) reaches top_p, four bits a pass (16
// masses a pass, each a fixed-order sum), then K's ties added one at a time
// as the host adds them, at most the limit's ties at its own key. `limit`
// itself when even its mass stays below top_p (rounding): the host then
// keeps all of it. The limit's key bounds every pass, so all of its ties
// count toward a digit; only the last step, at the limit's own key, stops
// at its tie count, which is where the host's walk stops too.
__device__ OrderCut NucleusCut(const SampleRowArgs& a, const float* xr,
                               const double* pr, int64_t cols, float row_max,
                               const OrderCut& limit, double kept_mass,
                               DrawShared& sh) {
  const int t = threadIdx.x;
  const uint32_t max_key = limit.whole_row ? 0xffffffffu : limit.key;
  // Without a limit the terms are p itself (the host's p / 1), which spares
  // top-p alone a double division per id and pass.
  const bool limited = !limit.whole_row;
  auto term = [&](int64_t i) { return limited ? pr[i] / kept_mass : pr[i]; };
  uint32_t prefix = 0;
  for (int shift = 28; shift >= 0; shift -= 4) {
    const uint32_t range = shift == 28 ? 0u : (0xffffffffu << (shift + 4));
    double bucket[16];
#pragma unroll
    for (int d = 0; d < 16; ++d) bucket[d] = 0.0;
    double base = 0.0;
    for (int64_t i = t; i < cols; i += kThreads) {
      const uint32_t k = OrderKey(xr, i, row_max);
      if (k > max_key) continue;
      const double p = term(i);
      if ((k & range) == prefix) {
        bucket[(k >> shift) & 15] += p;
      } else if (k < prefix) {
        base += p;
      }
    }
    base = BlockSumD<kThreads>(base, sh.warp_d);
    double cum = base;
    int digit = 16;
#pragma unroll
    for (int d = 0; d < 16; ++d) {
      cum += BlockSumD<kThreads>(bucket[d],
                                 sh.warp_d);  // (same value in every thread)
      if (digit == 16 && cum >= a.top_p) digit = d;
    }
    if (digit == 16) {
      if (shift == 28) return limit;
      digit = 15;  // (this pass's sums rounded below the last pass's)
    }
    prefix |= static_cast<uint32_t>(digit) << shift;
  }
  // (a pass whose sums rounded below the last's took digit 15, which may
  // pass the limit's key, where no id of the limit is)
  if (prefix > max_key) prefix = max_key;
  // The mass below K, and K's ties (equal keys: equal p).
  const KeyTally at_k = TallyKey(xr, cols, row_max, prefix, term, sh);
  OrderCut cut;
  cut.key = prefix;
  cut.whole_row = false;
  const int n_ties = !limit.whole_row && prefix == limit.key
                         ? min(at_k.ties, limit.ties)
                         : at_k.ties;
  // (no id at K: the digit-15 case above; the cut is then the keys below K)
  const double p_tie = n_ties > 0 ? term(at_k.tie_index) : 0.0;
  double c = at_k.below;
  int n = 0;
  while (n < n_ties) {
    c += p_tie;
    ++n;
    if (c >= a.top_p) break;
  }
  cut.ties = n;
  __syncthreads();
  return cut;
}

// The mass of the first ids of the order that `cut` (not the whole row)
// holds: the keys below its key, then its ties (equal keys: equal p). A
// fixed-order sum; the host's is in the filters' order (~1e-16 apart).
__device__ double CutMass(const float* xr, const double* pr, int64_t cols,
                          float row_max, const OrderCut& cut, DrawShared& sh) {
  const KeyTally at_cut = TallyKey(
      xr, cols, row_max, cut.key, [&](int64_t i) { return pr[i]; }, sh);
  const double mass =
      at_cut.below + (at_cut.ties > 0 ? cut.ties * pr[at_cut.tie_index] : 0.0);
  __syncthreads();  // (sh is reused by the caller)
  return mass;
}

// Top-k and/or top-p (then min-p) over the first `want` ids of the order.
// Returns the token, or -1 when the cut lies past the candidates (the caller
// then cuts the order without sorting it).
__device__ int DrawOrdered(const SampleRowArgs& a, const float* xr,
                           const double* pr, int64_t cols, float row_max,
                           DrawShared& sh) {
  const int t = threadIdx.x;
  const bool top_k = a.top_k > 0 && a.top_k < cols;
  if (top_k && a.top_k > kThreads) return -1;
  const int want =
      static_cast<int>(top_k ? a.top_k : (cols < kThreads ? cols : kThreads));

  const OrderCut first = SelectFirst(want, xr, cols, row_max, sh);
  const uint32_t cut = first.key;
  const int ties = first.ties;
  const int less = want - ties;

  // Compaction in id order: contiguous chunks, counts scanned in thread order.
  int64_t lo, hi;
  PartRange(cols, kThreads, t, &lo, &hi);
  int n_less = 0, n_tie = 0;
  for (int64_t i = lo; i < hi; ++i) {
    const uint32_t k = OrderKey(xr, i, row_max);
    n_less += k < cut;
    n_tie += k == cut;
  }
  BlockInclusiveScan(n_less, sh.incl_i, sh.warp_i);
  int at_less = sh.incl_i[t] - n_less;
  __syncthreads();
  BlockInclusiveScan(n_tie, sh.incl_i, sh.warp_i);
  int at_tie = sh.incl_i[t] - n_tie;
  sh.keys[t] = ~0ull;
  __syncthreads();
  for (int64_t i = lo; i < hi; ++i) {
    const uint32_t k = OrderKey(xr, i, row_max);
    int slot = -1;
    if (k < cut) {
      slot = at_less++;
    } else if (k == cut) {
      if (at_tie < ties) slot = less + at_tie;
      ++at_tie;
    }
    if (slot >= 0)
      sh.keys[slot] =
          (static_cast<uint64_t>(k) << 32) | static_cast<uint32_t>(i);
  }
  __syncthreads();
  BitonicSort(sh.keys);
  const int id = static_cast<int>(sh.keys[t] & 0xffffffffu);
  double* p = sh.incl;  // the candidates' p, in the filters' order
  p[t] = t < want ? pr[id] : 0.0;
  __syncthreads();

  // The host's loops, in its order (sampling.cc), by one thread.
  const int limit = top_k ? a.top_k : static_cast<int>(cols);
  const bool top_p = a.top_p < 1.0f;
  if (t == 0) {
    double kept_mass = 1.0;
    if (top_p && top_k) {
      kept_mass = 0.0;
      for (int i = 0; i < limit; ++i) kept_mass += p[i];
    }
    sh.kept = kept_mass;
  }
  __syncthreads();
  sh.term[t] = p[t] / sh.kept;  // (the host divides term by term too)
  __syncthreads();
  if (t == 0) {
    int keep = limit;
    int fallback = 0;
    if (top_p) {
      double cum = 0.0;
      int n = 0;
      while (n < limit) {
        if (n == want) {  // the nucleus needs more than the candidates
          fallback = 1;
          break;
        }
        cum += sh.term[n];
        ++n;
        if (cum >= a.top_p) break;
      }
      keep = n;
    }
    if (!fallback && a.min_p > 0.0f) {
      const double threshold = a.min_p * p[0];
      int n = 1;
      while (n < keep && p[n] >= threshold) ++n;
      keep = n;
    }
    double kept = 0.0;
    if (!fallback) {
      for (int i = 0; i < keep; ++i) kept += p[i];
    }
    sh.keep = keep;
    sh.kept = kept;
    sh.fallback = fallback;
  }
  __syncthreads();
  if (sh.fallback) return -1;
  const int keep = sh.keep;
  // The survivors in id order, each with its float probability.
  const float f = t < keep ? static_cast<float>(p[t] / sh.kept) : 0.0f;
  __syncthreads();
  sh.keys[t] =
      t < keep ? (static_cast<uint64_t>(id) << 32) | static_cast<uint32_t>(t)
               : ~0ull;
  sh.probs[t] = f;
  __syncthreads();
  BitonicSort(sh.keys);
  if (t == 0) {
    double sum = 0.0;
    for (int i = 0; i < keep; ++i) sum += sh.probs[sh.keys[i] & 0xffffffffu];
    const double target = static_cast<double>(a.uniform) * sum;
    double cum = 0.0;
    int token = -1;
    for (int i = 0; i < keep; ++i) {
      const float fi = sh.probs[sh.keys[i] & 0xffffffffu];
      if (fi <= 0.0f) continue;
      token = static_cast<int>(sh.keys[i] >> 32);
      cum += fi;
      if (target < cum) break;
    }
    sh.walker_token = token;
  }
  __syncthreads();
  return sh.walker_token;
}

__global__ void __launch_bounds__(kThreads)
    DrawKernel(const SampleRowArgs* args, const float* x, int64_t rows,
               int64_t cols, Scratch s, int32_t* out) {
  __shared__ DrawShared sh;
  const int row = blockIdx.x;
  const SampleRowArgs a = args[row];
  float row_max;
  if (!RowStats(s, row, &row_max)) {
    if (threadIdx.x == 0) {
      out[row] = 0;
      out[rows + row] = kSampleNonFinite;
    }
    return;
  }
  const double total = RowTotal(s, row);
  const double* pr = s.p + row * cols;
  const float* xr = x + a.x_offset;
  const bool top_k = a.top_k > 0 && a.top_k < cols;
  const bool top_p = a.top_p < 1.0f;
  int token;
  if (!top_k && !top_p) {
    token = DrawFromPrefix(a, xr, pr, cols, row_max, total, OrderCut{}, sh);
  } else {
    token = DrawOrdered(a, xr, pr, cols, row_max, sh);
    // Past the candidates: a prefix of the order found without sorting it
    // (the nucleus within the top-k's renormalized mass, as the host's).
    if (token < 0) {
      OrderCut cut;
      if (top_k) cut = SelectFirst(a.top_k, xr, cols, row_max, sh);
      if (top_p) {
        const double kept_mass =
            top_k ? CutMass(xr, pr, cols, row_max, cut, sh) : 1.0;
        cut = NucleusCut(a, xr, pr, cols, row_max, cut, kept_mass, sh);
      }
      token = DrawFromPrefix(a, xr, pr, cols, row_max, total, cut, sh);
    }
  }
  if (threadIdx.x == 0) {
    out[row] = token;
    out[rows + row] = kSampledOnDevice;
  }
}

}  // namespace

int64_t SampleRowsMaxRows(int64_t cols, const Workspace& ws) {
  const size_t fixed =
      AlignUp(sizeof(SampleRowArgs) * 64) + AlignUp(sizeof(int32_t) * 128);
  int64_t rows = 64;
  while (rows > 0 && fixed + ScratchBytes(rows, cols) > ws.bytes) rows /= 2;
  return rows;
}

absl::Status LaunchSampleRows(const SampleRowArgs* host_args, int64_t rows,
                              int64_t cols, const float* x, const Workspace& ws,
                              int32_t* host_out, cudaStream_t stream) {
  if (rows < 1 || rows > SampleRowsMaxRows(cols, ws)) {
    return absl::InvalidArgumentError(
        "sample_rows: rows exceed the workspace's group");
  }
  if (cols > INT32_MAX)
    return absl::InvalidArgumentError("sample_rows: cols exceed int32");
  char* base = static_cast<char*>(ws.data);
  auto* args = reinterpret_cast<SampleRowArgs*>(base);
  base += AlignUp(sizeof(SampleRowArgs) * 64);
  auto* out = reinterpret_cast<int32_t*>(base);
  base += AlignUp(sizeof(int32_t) * 128);
  const Scratch s = ScratchAt(base, rows, cols);
  SS_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(args, host_args, sizeof(SampleRowArgs) * rows,
                      cudaMemcpyHostToDevice, stream),
      "sample_rows args");
  const unsigned sliced = static_cast<unsigned>(rows * kSlices);
  StatsKernel<<<sliced, kSliceThreads, 0, stream>>>(args, x, cols, s);
  ExpKernel<<<sliced, kSliceThreads, 0, stream>>>(args, x, cols, s);
  NormKernel<<<sliced, kSliceThreads, 0, stream>>>(cols, s);
  DrawKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      args, x, rows, cols, s, out);
  if (absl::Status st = LaunchStatus("sample_rows launch"); !st.ok()) return st;
  SS_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_out, out, sizeof(int32_t) * 2 * rows,
                      cudaMemcpyDeviceToHost, stream),
      "sample_rows tokens");
  return absl::OkStatus();
}

}  // namespace specserve::kernels::cuda
