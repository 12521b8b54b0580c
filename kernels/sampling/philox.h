// Philox4x32-10: the counter-based random generator of sampled decoding.
//
// Randomness is a pure function of (seed, stream, counter), and no generator
// state is carried anywhere: the kSample stream's counter is the history index
// of the token being drawn (worker/spec/spec_accept.h PositionUniform; the
// "position uniform" of docs/DESIGN.md §1). So a session's draws never repeat,
// survive park/resume/offload unchanged, do not depend on how bursts split,
// and a (seed, session history) is reproducible on any backend.
#ifndef SPECSERVE_KERNELS_SAMPLING_PHILOX_H_
#define SPECSERVE_KERNELS_SAMPLING_PHILOX_H_

#include <array>
#include <cstdint>

namespace specserve::sampling {

// Philox4x32 with 10 rounds (Salmon et al., SC'11), on c in place.
inline void Philox4x32_10InPlace(uint32_t (&c)[4], uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u;
  constexpr uint32_t kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
  constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32),
                   lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32),
                   lo1 = static_cast<uint32_t>(p1);
    const uint32_t c1 = c[1], c3 = c[3];
    c[0] = hi1 ^ c1 ^ k0;
    c[1] = lo1;
    c[2] = hi0 ^ c3 ^ k1;
    c[3] = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
}

inline std::array<uint32_t, 4> Philox4x32_10(std::array<uint32_t, 4> counter,
                                             std::array<uint32_t, 2> key) {
  uint32_t c[4] = {counter[0], counter[1], counter[2], counter[3]};
  Philox4x32_10InPlace(c, key[0], key[1]);
  return {c[0], c[1], c[2], c[3]};
}

// Which sequence a draw belongs to; part of the counter so streams never
// overlap.
enum class RandomStream : uint32_t {
  kSample = 0,  // one draw per token position (the counter is the position)
};

// A uniform float in [0, 1) with 24 random bits, for counter `counter` of
// `stream` under `seed`.
inline float Uniform(uint64_t seed, RandomStream stream, uint32_t counter) {
  uint32_t c[4] = {counter, static_cast<uint32_t>(stream), 0u, 0u};
  Philox4x32_10InPlace(c, static_cast<uint32_t>(seed),
                       static_cast<uint32_t>(seed >> 32));
  // Top 24 bits: exactly representable, strictly below 1.
  return static_cast<float>(c[0] >> 8) * (1.0f / 16777216.0f);
}

}  // namespace specserve::sampling

#endif  // SPECSERVE_KERNELS_SAMPLING_PHILOX_H_
