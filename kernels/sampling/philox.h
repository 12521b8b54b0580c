// Philox4x32-10: the counter-based random generator of sampled decoding.
//
// Randomness is a pure function of (seed, stream, counter): no generator state
// is carried anywhere but the counters a session persists (sctr for sampling
// events, uctr for acceptance uniforms; DESIGN.md §1). So a session's draws
// never repeat across bursts, survive park/resume/offload unchanged, and a
// (seed, session history) is reproducible on any backend.
#ifndef SPECSERVE_KERNELS_SAMPLING_PHILOX_H_
#define SPECSERVE_KERNELS_SAMPLING_PHILOX_H_

#include <array>
#include <cstdint>

namespace specserve::sampling {

// Philox4x32 with 10 rounds (Salmon et al., SC'11).
std::array<uint32_t, 4> Philox4x32_10(std::array<uint32_t, 4> counter,
                                      std::array<uint32_t, 2> key);

// Which sequence a draw belongs to; part of the counter so streams never
// overlap.
enum class RandomStream : uint32_t {
  kSample = 0,  // one draw per sampling event (sctr)
  kAccept = 1,  // one draw per acceptance test (uctr)
};

// A uniform float in [0, 1) with 24 random bits, for event `counter` of
// `stream` under `seed`.
float Uniform(uint64_t seed, RandomStream stream, uint32_t counter);

}  // namespace specserve::sampling

#endif  // SPECSERVE_KERNELS_SAMPLING_PHILOX_H_
