#include "kernels/attention_inputs.h"

namespace specserve::kernels {

absl::Status Validate(const AttentionInputsParams& p) {
  for (const RmsNormParams* n : {&p.q_norm, &p.k_norm}) {
    if (absl::Status s = Validate(*n); !s.ok()) return s;
  }
  for (const RopeParams* r : {&p.q_rope, &p.k_rope}) {
    if (absl::Status s = Validate(*r); !s.ok()) return s;
  }
  for (const ScatterRowsParams* c : {&p.k_scatter, &p.v_scatter}) {
    if (absl::Status s = Validate(*c); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace specserve::kernels
