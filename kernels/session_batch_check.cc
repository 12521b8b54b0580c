#include "kernels/session_batch_check.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace specserve::kernels {
namespace {

class Helper {
 public:
  Helper(Backend* be, unsigned seed) : be_(be), rng_(seed) {}

  std::vector<float> Random(size_t n, float lo = -1, float hi = 1) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }
  Buffer Up(const void* data, size_t bytes) {
    auto b = be_->Allocate(std::max<size_t>(bytes, 4));
    EXPECT_TRUE(b.ok());
    EXPECT_TRUE(be_->CopyToDevice(b->data(), data, bytes).ok());
    return std::move(*b);
  }
  Buffer Up(const std::vector<float>& v) { return Up(v.data(), v.size() * 4); }
  std::vector<float> Down(const float* p, size_t n) {
    std::vector<float> v(n);
    EXPECT_TRUE(be_->CopyToHost(v.data(), p, n * 4).ok());
    return v;
  }
  // A backend array of the pointers' values.
  Buffer Pointers(const std::vector<float*>& ptrs) {
    std::vector<uint64_t> v;
    for (float* p : ptrs) v.push_back(reinterpret_cast<uintptr_t>(p));
    return Up(v.data(), v.size() * 8);
  }
  static float* const* Table(const Buffer& b) {
    return static_cast<float* const*>(b.data());
  }
  // The same table as cache pointers (ScatterRows, Attention).
  static void* const* CacheTable(const Buffer& b) {
    return static_cast<void* const*>(b.data());
  }

 private:
  Backend* be_;
  std::mt19937 rng_;
};

void ExpectSame(const std::vector<float>& a, const std::vector<float>& b,
                const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << what;
}

}  // namespace

void ExpectSessionBatchMatchesAlone(Backend* be, unsigned seed) {
  Helper h(be, seed);
  // Positions cross the attention kernels' chunk sizes (256 rows per chunk).
  const std::vector<int32_t> pos = {0, 5, 300, 17, 700, 1};
  const int B = static_cast<int>(pos.size());
  const int cap = 720;
  Buffer pos_b = h.Up(pos.data(), pos.size() * 4);
  const int32_t* positions = static_cast<const int32_t*>(pos_b.data());

  // ---- Rope + ScatterRows + Attention (gated GQA, rotary part of the head).
  {
    const int nh = 4, nkv = 2, hd = 32, rot = 16, kv_dim = nkv * hd;
    const int q_row = nh * 2 * hd;
    const std::vector<float> inv = RopeInvFreq(10000.0, rot);
    Buffer inv_b = h.Up(inv);
    const std::vector<float> q0 = h.Random(B * q_row, -2, 2),
                             k0 = h.Random(B * kv_dim, -2, 2),
                             v0 = h.Random(B * kv_dim);
    std::vector<std::vector<float>> kc0(B), vc0(B);
    std::vector<Buffer> kc_batch, vc_batch, kc_alone, vc_alone;
    std::vector<float*> kp, vp;
    for (int s = 0; s < B; ++s) {
      kc0[s] = h.Random(cap * kv_dim, -2, 2);
      vc0[s] = h.Random(cap * kv_dim);
      kc_batch.push_back(h.Up(kc0[s]));
      vc_batch.push_back(h.Up(vc0[s]));
      kc_alone.push_back(h.Up(kc0[s]));
      vc_alone.push_back(h.Up(vc0[s]));
      kp.push_back(kc_batch.back().f32());
      vp.push_back(vc_batch.back().f32());
    }
    Buffer kt = h.Pointers(kp), vt = h.Pointers(vp);
    Buffer qb = h.Up(q0), kb = h.Up(k0), vb = h.Up(v0),
           ob = h.Up(std::vector<float>(B * nh * hd));
    RopeParams rq;
    rq.rows = B;
    rq.heads = nh;
    rq.head_dim = hd;
    rq.rotary_dim = rot;
    rq.x = qb.f32();
    rq.row_stride = q_row;
    rq.head_stride = 2 * hd;
    rq.inv_freq = inv_b.f32();
    rq.positions = positions;
    ASSERT_TRUE(be->Rope(rq).ok());
    RopeParams rk = rq;
    rk.heads = nkv;
    rk.x = kb.f32();
    rk.row_stride = kv_dim;
    rk.head_stride = hd;
    ASSERT_TRUE(be->Rope(rk).ok());
    ScatterRowsParams sk;
    sk.rows = B;
    sk.cols = kv_dim;
    sk.src = kb.f32();
    sk.src_stride = kv_dim;
    sk.dst = Helper::CacheTable(kt);
    sk.dst_rows = positions;
    sk.dst_row_stride = kv_dim;
    ASSERT_TRUE(be->ScatterRows(sk).ok());
    ScatterRowsParams sv = sk;
    sv.src = vb.f32();
    sv.dst = Helper::CacheTable(vt);
    ASSERT_TRUE(be->ScatterRows(sv).ok());
    AttentionParams at;
    at.rows = B;
    at.num_heads = nh;
    at.num_kv_heads = nkv;
    at.head_dim = hd;
    at.q = qb.f32();
    at.q_row_stride = q_row;
    at.q_head_stride = 2 * hd;
    at.gate = qb.f32() + hd;
    at.gate_row_stride = q_row;
    at.gate_head_stride = 2 * hd;
    at.kv_row_stride = kv_dim;
    at.out = ob.f32();
    at.out_row_stride = nh * hd;
    at.scale = 0.17f;
    at.positions = positions;
    at.k_caches = Helper::CacheTable(kt);
    at.v_caches = Helper::CacheTable(vt);
    at.max_position = 700;
    ASSERT_TRUE(be->Attention(at).ok());
    const std::vector<float> out = h.Down(ob.f32(), B * nh * hd);
    const std::vector<float> q_batch = h.Down(qb.f32(), B * q_row);

    for (int s = 0; s < B; ++s) {
      const std::string tag = "session " + std::to_string(s);
      Buffer q1 = h.Up(q0.data() + s * q_row, q_row * 4);
      RopeParams r1 = rq;
      r1.rows = 1;
      r1.x = q1.f32();
      r1.positions = nullptr;
      r1.first_position = pos[s];
      ASSERT_TRUE(be->Rope(r1).ok());
      // The key goes straight into its cache row, as a lone decode does.
      float* krow = kc_alone[s].f32() + pos[s] * kv_dim;
      ASSERT_TRUE(
          be->CopyToDevice(krow, k0.data() + s * kv_dim, kv_dim * 4).ok());
      ASSERT_TRUE(be->CopyToDevice(vc_alone[s].f32() + pos[s] * kv_dim,
                                   v0.data() + s * kv_dim, kv_dim * 4)
                      .ok());
      RopeParams r2 = r1;
      r2.heads = nkv;
      r2.x = krow;
      r2.row_stride = kv_dim;
      r2.head_stride = hd;
      ASSERT_TRUE(be->Rope(r2).ok());
      Buffer o1 = h.Up(std::vector<float>(nh * hd));
      AttentionParams a1 = at;
      a1.rows = 1;
      a1.q = q1.f32();
      a1.gate = q1.f32() + hd;
      a1.out = o1.f32();
      a1.positions = nullptr;
      a1.k_caches = a1.v_caches = nullptr;
      a1.k_cache = kc_alone[s].f32();
      a1.v_cache = vc_alone[s].f32();
      a1.capacity = cap;
      a1.first_position = pos[s];
      ASSERT_TRUE(be->Attention(a1).ok());
      ExpectSame(h.Down(q1.f32(), q_row),
                 std::vector<float>(q_batch.begin() + s * q_row,
                                    q_batch.begin() + (s + 1) * q_row),
                 "rope q " + tag);
      ExpectSame(h.Down(kc_alone[s].f32(), cap * kv_dim),
                 h.Down(kc_batch[s].f32(), cap * kv_dim), "k cache " + tag);
      ExpectSame(h.Down(vc_alone[s].f32(), cap * kv_dim),
                 h.Down(vc_batch[s].f32(), cap * kv_dim), "v cache " + tag);
      ExpectSame(h.Down(o1.f32(), nh * hd),
                 std::vector<float>(out.begin() + s * nh * hd,
                                    out.begin() + (s + 1) * nh * hd),
                 "attention " + tag);
    }
  }

  // ---- Conv1d and GatedDeltaRule on per-session states, in place.
  {
    const int nk = 2, nv = 4, dk = 24, dv = 40, kernel = 4;
    const int key_dim = nk * dk, conv_dim = 2 * key_dim + nv * dv;
    const int cstate = conv_dim * (kernel - 1), rstate = nv * dk * dv;
    const std::vector<float> x = h.Random(B * conv_dim, -2, 2),
                             w = h.Random(conv_dim * kernel),
                             a = h.Random(B * nv, -3, 3),
                             b = h.Random(B * nv, -3, 3),
                             a_log = h.Random(nv, -1, 2), dt = h.Random(nv);
    Buffer xb = h.Up(x), wb = h.Up(w), ab = h.Up(a), bb = h.Up(b),
           lb = h.Up(a_log), db = h.Up(dt),
           yb = h.Up(std::vector<float>(B * conv_dim)),
           ob = h.Up(std::vector<float>(B * nv * dv));
    std::vector<std::vector<float>> cs0(B), rs0(B);
    std::vector<Buffer> cs_batch, rs_batch;
    std::vector<float*> cp, rp;
    for (int s = 0; s < B; ++s) {
      cs0[s] = h.Random(cstate);
      rs0[s] = h.Random(rstate, -0.5, 0.5);
      cs_batch.push_back(h.Up(cs0[s]));
      rs_batch.push_back(h.Up(rs0[s]));
      cp.push_back(cs_batch.back().f32());
      rp.push_back(rs_batch.back().f32());
    }
    Buffer ct = h.Pointers(cp), rt = h.Pointers(rp);
    Conv1dParams cv;
    cv.rows = B;
    cv.channels = conv_dim;
    cv.kernel = kernel;
    cv.x = xb.f32();
    cv.x_stride = conv_dim;
    cv.y = yb.f32();
    cv.y_stride = conv_dim;
    cv.weight = wb.f32();
    cv.states = Helper::Table(ct);
    ASSERT_TRUE(be->Conv1d(cv).ok());
    GatedDeltaRuleParams g;
    g.rows = B;
    g.num_k_heads = nk;
    g.num_v_heads = nv;
    g.k_head_dim = dk;
    g.v_head_dim = dv;
    g.q = yb.f32();
    g.k = yb.f32() + key_dim;
    g.v = yb.f32() + 2 * key_dim;
    g.qkv_stride = conv_dim;
    g.a = ab.f32();
    g.b = bb.f32();
    g.ab_stride = nv;
    g.a_log = lb.f32();
    g.dt_bias = db.f32();
    g.out = ob.f32();
    g.out_stride = nv * dv;
    g.states = Helper::CacheTable(rt);
    ASSERT_TRUE(be->GatedDeltaRule(g).ok());
    const std::vector<float> y = h.Down(yb.f32(), B * conv_dim),
                             out = h.Down(ob.f32(), B * nv * dv);
    for (int s = 0; s < B; ++s) {
      const std::string tag = "session " + std::to_string(s);
      Buffer cs = h.Up(cs0[s]), rs = h.Up(rs0[s]),
             x1 = h.Up(x.data() + s * conv_dim, conv_dim * 4),
             y1 = h.Up(std::vector<float>(conv_dim)),
             a1 = h.Up(a.data() + s * nv, nv * 4),
             b1 = h.Up(b.data() + s * nv, nv * 4),
             o1 = h.Up(std::vector<float>(nv * dv));
      Conv1dParams c1 = cv;
      c1.rows = 1;
      c1.x = x1.f32();
      c1.y = y1.f32();
      c1.states = nullptr;
      c1.state_in = c1.state_out = cs.f32();
      ASSERT_TRUE(be->Conv1d(c1).ok());
      GatedDeltaRuleParams g1 = g;
      g1.rows = 1;
      g1.q = y1.f32();
      g1.k = y1.f32() + key_dim;
      g1.v = y1.f32() + 2 * key_dim;
      g1.a = a1.f32();
      g1.b = b1.f32();
      g1.out = o1.f32();
      g1.states = nullptr;
      g1.state_in = g1.state_out = rs.f32();
      ASSERT_TRUE(be->GatedDeltaRule(g1).ok());
      ExpectSame(h.Down(y1.f32(), conv_dim),
                 std::vector<float>(y.begin() + s * conv_dim,
                                    y.begin() + (s + 1) * conv_dim),
                 "conv y " + tag);
      ExpectSame(h.Down(cs.f32(), cstate), h.Down(cs_batch[s].f32(), cstate),
                 "conv state " + tag);
      ExpectSame(h.Down(o1.f32(), nv * dv),
                 std::vector<float>(out.begin() + s * nv * dv,
                                    out.begin() + (s + 1) * nv * dv),
                 "delta out " + tag);
      ExpectSame(h.Down(rs.f32(), rstate), h.Down(rs_batch[s].f32(), rstate),
                 "delta state " + tag);
    }

    // The rule again on bf16 states (state_dtype), from the batch's conv
    // outputs (the lone ones' bits, checked above): batched == alone.
    // (rstate is even: the bf16 states compare as floats' bytes.)
    std::vector<Buffer> r16_batch, r16_alone;
    std::vector<float*> r16p;
    for (int s = 0; s < B; ++s) {
      std::vector<uint16_t> bits(rstate);
      for (int i = 0; i < rstate; ++i) {
        uint32_t u;
        std::memcpy(&u, &rs0[s][i], 4);
        bits[i] = static_cast<uint16_t>(u >> 16);  // any bf16 is a state
      }
      r16_batch.push_back(h.Up(bits.data(), rstate * 2));
      r16_alone.push_back(h.Up(bits.data(), rstate * 2));
      r16p.push_back(r16_batch.back().f32());
    }
    Buffer rt16 = h.Pointers(r16p),
           ob16 = h.Up(std::vector<float>(B * nv * dv));
    GatedDeltaRuleParams g16 = g;
    g16.state_dtype = DType::kBF16;
    g16.states = Helper::CacheTable(rt16);
    g16.out = ob16.f32();
    ASSERT_TRUE(be->GatedDeltaRule(g16).ok());
    const std::vector<float> out16 = h.Down(ob16.f32(), B * nv * dv);
    for (int s = 0; s < B; ++s) {
      const std::string tag = "bf16 state, session " + std::to_string(s);
      Buffer o1 = h.Up(std::vector<float>(nv * dv));
      GatedDeltaRuleParams g1 = g16;
      g1.rows = 1;
      g1.q = g16.q + s * conv_dim;
      g1.k = g16.k + s * conv_dim;
      g1.v = g16.v + s * conv_dim;
      g1.a = g16.a + s * nv;
      g1.b = g16.b + s * nv;
      g1.out = o1.f32();
      g1.states = nullptr;
      g1.state_in = g1.state_out = r16_alone[s].data();
      ASSERT_TRUE(be->GatedDeltaRule(g1).ok());
      ExpectSame(h.Down(o1.f32(), nv * dv),
                 std::vector<float>(out16.begin() + s * nv * dv,
                                    out16.begin() + (s + 1) * nv * dv),
                 "delta out " + tag);
      ExpectSame(h.Down(r16_alone[s].f32(), rstate / 2),
                 h.Down(r16_batch[s].f32(), rstate / 2), "delta state " + tag);
    }
  }
}

}  // namespace specserve::kernels
