// Golden end-to-end test: the CPU forward against Hugging Face transformers'
// fp32 output on every fixture in tests/fixtures (written by
// tools/make_reference): prompt logits, the greedy continuation, the MTP
// head's draft logits per row and its k-step chain. Twice: with the CPU's
// exact prefill (the per-token delta rule), and with its chunked form
// (CpuBackendOptions.chunked_prefill), transformers' own algorithm here.
//
// What the fixtures' prompt logits ran, read from transformers 5.x
// (models/qwen3_5/modeling_qwen3_5.py; the fixtures name 5.17.0):
// make_reference takes them from one forward with use_cache=False, so the
// text model builds no cache and every Qwen3_5GatedDeltaNet layer gets
// cache_params None; that layer runs its recurrent rule only with a cache
// that already holds a state and a one-token input, so here it runs
// chunk_gated_delta_rule. That is torch_chunk_gated_delta_rule unless the
// flash-linear-attention package is importable (its kernels run on GPU
// tensors; make_reference keeps every tensor on the CPU), with its
// default chunk_size of 64: chunks from the call's first token (position
// 0 for a prompt, our absolute grid), the last one zero-padded, the same
// UT transform, intra-chunk products and end-of-chunk state update as
// kernels/cpu/chunked_delta_rule.h, all in fp32. The fixtures' prompts are
// at most 24 tokens, one partial chunk each: the carry of the state across
// chunk boundaries is checked against the exact rule by
// kernels/cpu/chunked_delta_rule_test, not here.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "worker/model/model.h"
#include "worker/model/test_data.h"

namespace specserve::model {
namespace {

using testing::Fixture;
using testing::FixturePrompt;

constexpr double kRelTol = 1e-3;   // max |Δ| <= kRelTol · max |logit_hf|
constexpr float kNearTie = 1e-3f;  // greedy margins at or below: may differ

// max |got − want| / max |want| over one row.
double RelError(const float* got, const std::vector<float>& want) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(double(want[i])));
  }
  return worst / std::max(scale, 1e-30);
}

// The fixture at `path` on a CPU backend with `options`.
void CheckParity(const std::string& path,
                 const kernels::cpu::CpuBackendOptions& options) {
  auto fixture = testing::LoadFixture(path);
  ASSERT_TRUE(fixture.ok()) << fixture.status();
  const Fixture& f = *fixture;
  kernels::cpu::CpuBackend backend(options);
  ASSERT_EQ(backend.ExactPrefill(), !options.chunked_prefill);
  auto model = Model::Load(testing::RepoPath(f.model), &backend);
  ASSERT_TRUE(model.ok()) << model.status();
  Model& m = **model;
  const int V = m.config().vocab_size, H = m.config().hidden_size;
  double worst_logits = 0, worst_mtp = 0, worst_chain = 0;
  int greedy_checked = 0, prompts = 0;

  for (const FixturePrompt& p : f.prompts) {
    SCOPED_TRACE("prompt of " + std::to_string(p.ids.size()) + " tokens");
    ++prompts;
    const int T = static_cast<int>(p.ids.size());
    auto state =
        m.NewState({.capacity = T + static_cast<int>(p.greedy.size()) + 8});
    ASSERT_TRUE(state.ok()) << state.status();
    ForwardResult r;
    ASSERT_TRUE(m.Prefill(state->get(), p.ids, {.all_rows = true}, &r).ok());
    ASSERT_EQ(r.rows, T);
    ASSERT_EQ(static_cast<int>(p.logits.size()), T);
    for (int t = 0; t < T; ++t) {
      ASSERT_EQ(static_cast<int>(p.logits[t].size()), V);
      const double e = RelError(r.logits.data() + t * V, p.logits[t]);
      worst_logits = std::max(worst_logits, e);
      EXPECT_LE(e, kRelTol) << "logits at position " << t;
    }
    const std::vector<float> prompt_hidden = r.hidden;

    // Greedy continuation; stop comparing at the first near-tie divergence.
    int32_t next = r.argmax[T - 1];
    for (size_t i = 0; i < p.greedy.size(); ++i) {
      if (next != p.greedy[i]) {
        ASSERT_LE(p.greedy_margin[i], kNearTie)
            << "greedy step " << i << ": got " << next << ", HF "
            << p.greedy[i];
        break;
      }
      ++greedy_checked;
      if (i + 1 == p.greedy.size()) break;
      ForwardResult d;
      ASSERT_TRUE(m.Decode(state->get(), next, &d).ok());
      next = d.argmax[0];
    }

    if (!m.has_mtp()) continue;
    // MTP rows p = 0..T−2: (h_p, t_{p+1}) at position p.
    ASSERT_EQ(static_cast<int>(p.mtp_logits.size()), T - 1);
    if (T > 1) {
      ForwardResult mr;
      ASSERT_TRUE(
          m.MtpForward(state->get(),
                       absl::MakeConstSpan(prompt_hidden.data(), (T - 1) * H),
                       absl::MakeConstSpan(p.ids.data() + 1, T - 1), 0, &mr)
              .ok());
      for (int t = 0; t < T - 1; ++t) {
        const double e = RelError(mr.logits.data() + t * V, p.mtp_logits[t]);
        worst_mtp = std::max(worst_mtp, e);
        EXPECT_LE(e, kRelTol) << "mtp row " << t;
      }
    }
    // The k-step chain after the prompt.
    if (p.has_mtp_chain) {
      const auto& chain = p.mtp_chain;
      std::vector<float> h(prompt_hidden.end() - H, prompt_hidden.end());
      int32_t token = chain.start_token;
      for (size_t j = 0; j < chain.draft_ids.size(); ++j) {
        ForwardResult dr;
        ASSERT_TRUE(m.MtpDraft(state->get(), h, token, T - 1 + j, &dr).ok());
        const double e = RelError(dr.logits.data(), chain.logits[j]);
        worst_chain = std::max(worst_chain, e);
        EXPECT_LE(e, kRelTol) << "mtp chain step " << j;
        // Our draft agrees with HF's unless HF's own top-2 is a near tie.
        std::vector<float> sorted = chain.logits[j];
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(),
                          std::greater<float>());
        if (sorted[0] - sorted[1] > kNearTie) {
          EXPECT_EQ(dr.argmax[0], chain.draft_ids[j]) << "draft step " << j;
        }
        h = dr.hidden;
        token = chain.draft_ids[j];
      }
    }
  }
  std::printf(
      "PARITY %s (%s prefill): prompts=%d max_rel_logits=%.3g "
      "max_rel_mtp_rows=%.3g max_rel_mtp_chain=%.3g "
      "greedy_tokens_matched=%d\n",
      f.name.c_str(), options.chunked_prefill ? "chunked" : "exact", prompts,
      worst_logits, worst_mtp, worst_chain, greedy_checked);
  ::testing::Test::RecordProperty("max_rel_logits",
                                  std::to_string(worst_logits));
  ::testing::Test::RecordProperty(
      "max_rel_mtp", std::to_string(std::max(worst_mtp, worst_chain)));
}

class HfParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfParityTest, MatchesTransformers) { CheckParity(GetParam(), {}); }

TEST_P(HfParityTest, ChunkedPrefillMatchesTransformers) {
  kernels::cpu::CpuBackendOptions options;
  options.chunked_prefill = true;
  CheckParity(GetParam(), options);
}

// The option reaches Model::Prefill: some prompt row's logits differ in
// their bits from the exact prefill's (the two forms round differently).
TEST_P(HfParityTest, ChunkedPrefillIsNotTheExactRule) {
  auto fixture = testing::LoadFixture(GetParam());
  ASSERT_TRUE(fixture.ok()) << fixture.status();
  kernels::cpu::CpuBackendOptions options;
  options.chunked_prefill = true;
  kernels::cpu::CpuBackend exact, chunked(options);
  const std::string dir = testing::RepoPath(fixture->model);
  auto me = Model::Load(dir, &exact);
  auto mc = Model::Load(dir, &chunked);
  ASSERT_TRUE(me.ok()) << me.status();
  ASSERT_TRUE(mc.ok()) << mc.status();
  bool differ = false;
  for (const FixturePrompt& p : fixture->prompts) {
    const int T = static_cast<int>(p.ids.size());
    auto se = (*me)->NewState({.capacity = T});
    auto sc = (*mc)->NewState({.capacity = T});
    ASSERT_TRUE(se.ok() && sc.ok());
    ForwardResult re, rc;
    ASSERT_TRUE((*me)->Prefill(se->get(), p.ids, {.all_rows = true}, &re).ok());
    ASSERT_TRUE((*mc)->Prefill(sc->get(), p.ids, {.all_rows = true}, &rc).ok());
    ASSERT_EQ(re.logits.size(), rc.logits.size());
    differ = differ || std::memcmp(re.logits.data(), rc.logits.data(),
                                   re.logits.size() * sizeof(float)) != 0;
  }
  EXPECT_TRUE(differ) << "chunked_prefill left every prompt's logits as the "
                         "exact prefill's";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfParityTest,
                         ::testing::ValuesIn(testing::FixtureFiles()),
                         testing::PathParamName);

TEST(HfParityFixturesTest, FixturesExist) {
  EXPECT_FALSE(testing::FixtureFiles().empty()) << "no tests/fixtures/*.json";
}

}  // namespace
}  // namespace specserve::model
