// Internal to the model forward: the activation buffers one pass uses,
// allocated once per Model in backend memory. Shapes in model.h notation
// (R = kMaxRows; P = kMaxPrefillRows for the trunk's buffers, which a
// prefill pass fills).
#ifndef SPECSERVE_WORKER_MODEL_WORKSPACE_H_
#define SPECSERVE_WORKER_MODEL_WORKSPACE_H_

#include <cstdint>
#include <vector>

#include "kernels/types.h"
#include "worker/model/model.h"

namespace specserve::model {

struct Model::Workspace {
  Buffer ids;       // int32 [P]
  Buffer h;         // [P][H] residual stream
  Buffer hidden;    // [P][H] final-norm hidden (lm_head input)
  Buffer mixed;     // [P][in_proj_dim] in_proj output: [qkv conv_dim |
                    // z value_dim (output gate) | b nv | a nv]
  Buffer conv_out;  // [P][conv_dim] after conv + SiLU: [q | k | v]
  Buffer core;      // [P][value_dim] delta-rule output, gated-normed in place
  Buffer qkv;       // [P][nh·2·hd + 2·nkv·hd]: per head [query | gate],
                    // then keys, then values (copied to the caches after
                    // k_norm and RoPE)
  Buffer attn;      // [P][nh·hd] gated attention output
  Buffer mlp;       // [P][2·I] [gate | up], activation in the gate half
  Buffer last_hidden;  // [R][H] each session's last prefill row (lm_head input)
  Buffer mtp_cat;      // [R][2·H] [norm_emb(e) | norm_hid(h)]
  Buffer mtp_in;       // [R][H] trunk hiddens given to the MTP head
  Buffer logits;       // [R][V]
  Buffer argmax;       // int32 [2R]: a pass of n rows puts its argmax at
                       // [0, n) and its finite flags at [n, 2n) (one copy)
  // Session table (DecodeBatch of B > 1 sessions, every recorded step),
  // uploaded once per step: per full-attention layer i, K then V cache
  // pointers [B] at entries 2i·B and (2i+1)·B; per linear layer j, conv
  // then recurrent state pointers at (2F+2j)·B and (2F+2j+1)·B (F
  // full-attention layers); then the int32 positions [B]. Sized for B = R. A
  // recorded MTP draft step puts its one-row table here instead (mtp.cc).
  Buffer batch;
  std::vector<uint64_t> batch_host;  // host staging of `batch`
};

// A buffer's backend address as a session-table entry.
inline uint64_t DeviceAddress(const Buffer& b) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(b.data()));
}

}  // namespace specserve::model

#endif  // SPECSERVE_WORKER_MODEL_WORKSPACE_H_
