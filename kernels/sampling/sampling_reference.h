// The sampling filters (sampling.h) by their definition: sort the whole
// vocabulary by probability (ties by id), cut by top-k, then top-p over the
// survivors' renormalized mass, then min-p, and renormalize. O(V log V):
// FilteredProbs keeps the same tokens while sorting only the prefix it
// reads; tests compare the two and tools/sampling_bench times them.
#ifndef SPECSERVE_KERNELS_SAMPLING_SAMPLING_REFERENCE_H_
#define SPECSERVE_KERNELS_SAMPLING_SAMPLING_REFERENCE_H_

#include <vector>

#include "kernels/sampling/sampling.h"

namespace specserve::sampling {

// probs[i] for finite logits (the caller checks finiteness), in double.
std::vector<double> FilteredProbsByFullSort(const std::vector<float>& logits,
                                            const SamplingConfig& c);

}  // namespace specserve::sampling

#endif  // SPECSERVE_KERNELS_SAMPLING_SAMPLING_REFERENCE_H_
