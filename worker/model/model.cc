// Model: loading and the trunk passes (Prefill, Decode, Verify). States are
// in state.cc, sublayers in blocks.cc, the MTP head in mtp.cc.
#include "worker/model/model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/gated_delta_rule.h"
#include "telemetry/status_macros.h"
#include "worker/model/workspace.h"

namespace specserve::model {

Model::~Model() = default;

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& model_dir,
                                                   kernels::Backend* backend) {
  SS_ASSIGN_OR_RETURN(auto checkpoint,
                      model_files::Checkpoint::Open(model_dir));
  return FromCheckpoint(std::move(checkpoint), backend);
}

absl::StatusOr<std::unique_ptr<Model>> Model::FromCheckpoint(
    std::unique_ptr<model_files::Checkpoint> checkpoint,
    kernels::Backend* backend) {
  CHECK(backend != nullptr) << "Model needs a backend";
  std::unique_ptr<Model> m(new Model());
  m->config_ = checkpoint->config();
  m->checkpoint_ = std::move(checkpoint);
  m->backend_ = backend;
  m->kv_dtype_ = backend->KvCacheDType();
  m->rec_dtype_ = backend->RecurrentStateDType();
  if (m->rec_dtype_ != kernels::DType::kF32 &&
      m->rec_dtype_ != kernels::DType::kBF16) {
    return absl::InvalidArgumentError(
        "model: the recurrent state type is fp32 or bf16");
  }
  const ModelConfig& c = m->config_;
  if (c.linear_conv_kernel_dim < 2 &&
      c.num_full_attention_layers() < c.num_hidden_layers) {
    return absl::InvalidArgumentError("linear_conv_kernel_dim must be >= 2");
  }
  SS_RETURN_IF_ERROR(m->LoadWeights());
  SS_RETURN_IF_ERROR(m->EnsureWorkspace());
  return m;
}

size_t Model::recurrent_state_bytes() const {
  return static_cast<size_t>(config_.linear_num_value_heads) *
         config_.linear_key_head_dim * config_.linear_value_head_dim *
         kernels::DTypeSize(rec_dtype_);
}

size_t Model::kv_row_bytes() const {
  return static_cast<size_t>(config_.num_key_value_heads) * config_.head_dim *
         kernels::DTypeSize(kv_dtype_);
}

absl::Status Model::EnsureWorkspace() {
  if (ws_ != nullptr) return absl::OkStatus();
  const ModelConfig& c = config_;
  const size_t R = kMaxRows;
  auto ws = std::make_unique<Workspace>();
  kernels::Backend& be = *backend_;
  auto floats_for = [&](size_t rows, Buffer* b,
                        size_t per_row) -> absl::Status {
    SS_ASSIGN_OR_RETURN(*b,
                        be.AllocateFloats(rows * std::max<size_t>(per_row, 1)));
    return absl::OkStatus();
  };
  // The trunk's buffers hold a prefill pass; the rest one of kMaxRows rows.
  auto trunk = [&](Buffer* b, size_t per_row) {
    return floats_for(kMaxPrefillRows, b, per_row);
  };
  auto floats = [&](Buffer* b, size_t per_row) {
    return floats_for(R, b, per_row);
  };
  const size_t H = c.hidden_size;
  SS_RETURN_IF_ERROR(trunk(&ws->ids, 1));
  SS_RETURN_IF_ERROR(trunk(&ws->h, H));
  SS_RETURN_IF_ERROR(trunk(&ws->hidden, H));
  SS_RETURN_IF_ERROR(trunk(&ws->mixed, c.in_proj_dim()));
  SS_RETURN_IF_ERROR(trunk(&ws->conv_out, c.conv_dim()));
  SS_RETURN_IF_ERROR(trunk(&ws->core, c.value_dim()));
  SS_RETURN_IF_ERROR(
      trunk(&ws->qkv,
            2 * (c.num_attention_heads + c.num_key_value_heads) * c.head_dim));
  SS_RETURN_IF_ERROR(trunk(&ws->attn, c.num_attention_heads * c.head_dim));
  SS_RETURN_IF_ERROR(trunk(&ws->mlp, 2 * c.intermediate_size));
  SS_RETURN_IF_ERROR(floats(&ws->last_hidden, H));
  SS_RETURN_IF_ERROR(floats(&ws->mtp_cat, 2 * H));
  SS_RETURN_IF_ERROR(floats(&ws->mtp_in, H));
  SS_RETURN_IF_ERROR(floats(&ws->logits, c.vocab_size));
  SS_RETURN_IF_ERROR(floats(&ws->argmax, 2));
  {
    const size_t entries =
        2 * static_cast<size_t>(c.num_hidden_layers) * R + (R + 1) / 2;
    SS_ASSIGN_OR_RETURN(ws->batch, be.Allocate(entries * sizeof(uint64_t)));
    ws->batch_host.reserve(entries);
  }
  ws_ = std::move(ws);
  return absl::OkStatus();
}

absl::Status Model::CheckTokens(absl::Span<const int32_t> tokens) const {
  for (int32_t t : tokens) {
    if (t < 0 || t >= config_.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", t, " outside the vocabulary [0, ",
                       config_.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status Model::CheckResident(const ModelState& state) {
  if (state.offloaded_) {
    return absl::FailedPreconditionError("session caches are offloaded");
  }
  return absl::OkStatus();
}

absl::Status Model::RunTrunk(absl::Span<ModelState* const> states,
                             absl::Span<const Slice> slices,
                             absl::Span<const int32_t> tokens, Mode mode) {
  const int rows = static_cast<int>(tokens.size());
  CHECK(rows >= 1 &&
        rows <= (mode == Mode::kPrefill ? kMaxPrefillRows : kMaxRows))
      << "RunTrunk rows " << rows;
  CHECK_EQ(states.size(), slices.size()) << "one slice per state";
  int next_row = 0;
  for (size_t i = 0; i < slices.size(); ++i) {
    const Slice& s = slices[i];
    CHECK(s.row0 == next_row && s.rows >= 1) << "slices cover the rows";
    CHECK(!states[i]->offloaded_) << "caller checks residency";
    CHECK_LE(s.start + s.rows, states[i]->capacity_)
        << "caller checks the capacity";
    next_row += s.rows;
  }
  CHECK_EQ(next_row, rows) << "slices cover the rows";

  // A session batch (one row per session, B > 1): one table upload, then
  // the cache ops run once per layer over all sessions.
  const int B = static_cast<int>(slices.size());
  bool session_batch = B > 1 && mode != Mode::kPrefill;
  for (const Slice& s : slices) session_batch = session_batch && s.rows == 1;
  SessionBatch batch;
  if (session_batch) {
    std::vector<int> positions(B);
    int max_position = 0;
    for (int i = 0; i < B; ++i) {
      positions[i] = slices[i].start;
      max_position = std::max(max_position, positions[i]);
    }
    SS_RETURN_IF_ERROR(
        UploadSessionTable(states, positions, max_position, &batch));
  }
  SS_RETURN_IF_ERROR(UploadIds(tokens));
  return TrunkOps(states, slices, rows, mode, session_batch ? &batch : nullptr);
}

absl::Status Model::UploadSessionTable(absl::Span<ModelState* const> states,
                                       absl::Span<const int> positions,
                                       int max_position, SessionBatch* batch) {
  const int B = static_cast<int>(states.size());
  CHECK(B >= 1 && B <= kMaxRows && positions.size() == states.size());
  const size_t nf = config_.num_full_attention_layers();
  const size_t nl = weights_.layers.size() - nf;
  std::vector<uint64_t>& tab = ws_->batch_host;
  tab.assign(2 * (nf + nl) * B + (B + 1) / 2, 0);
  int32_t* pos = reinterpret_cast<int32_t*>(tab.data() + 2 * (nf + nl) * B);
  for (int s = 0; s < B; ++s) {
    const ModelState& st = *states[s];
    CHECK_EQ(st.kv_.size(), nf) << "one KV cache per full-attention layer";
    CHECK_EQ(st.linear_.size(), nl) << "one state per linear layer";
    CHECK_LE(positions[s], max_position);
    for (size_t i = 0; i < nf; ++i) {
      tab[(2 * i) * B + s] = DeviceAddress(st.kv_[i].k);
      tab[(2 * i + 1) * B + s] = DeviceAddress(st.kv_[i].v);
    }
    for (size_t j = 0; j < nl; ++j) {
      tab[(2 * nf + 2 * j) * B + s] = DeviceAddress(st.linear_[j].conv);
      tab[(2 * nf + 2 * j + 1) * B + s] =
          DeviceAddress(st.linear_[j].recurrent);
    }
    pos[s] = positions[s];
  }
  uint64_t* dev = static_cast<uint64_t*>(ws_->batch.data());
  SS_RETURN_IF_ERROR(
      backend_->CopyToDevice(dev, tab.data(), tab.size() * sizeof(uint64_t)));
  batch->sessions = B;
  batch->table = dev;
  batch->positions = reinterpret_cast<const int32_t*>(dev + 2 * (nf + nl) * B);
  batch->max_position = max_position;
  return absl::OkStatus();
}

absl::Status Model::TrunkOps(absl::Span<ModelState* const> states,
                             absl::Span<const Slice> slices, int rows,
                             Mode mode, const SessionBatch* batch) {
  const ModelConfig& c = config_;
  Workspace& ws = *ws_;
  SS_RETURN_IF_ERROR(EmbedUploaded(rows));
  const size_t nf = c.num_full_attention_layers();
  // This layer's entries of the session table: [B] pointers from `entry`.
  SessionBatch layer_batch = batch != nullptr ? *batch : SessionBatch{};
  auto table = [&](size_t entry) {
    return reinterpret_cast<float* const*>(layer_batch.table +
                                           entry * layer_batch.sessions);
  };
  auto kv_table = [&](size_t entry) {
    return reinterpret_cast<void* const*>(layer_batch.table +
                                          entry * layer_batch.sessions);
  };
  size_t kv_i = 0, lin_i = 0;
  std::vector<KvCache*> kvs(states.size());
  std::vector<LinearCache*> linear(states.size());
  for (const LayerWeights& layer : weights_.layers) {
    if (layer.type == LayerType::kFullAttention) {
      for (size_t i = 0; i < states.size(); ++i) kvs[i] = &states[i]->kv_[kv_i];
      if (batch != nullptr) {
        layer_batch.k = kv_table(2 * kv_i);
        layer_batch.v = kv_table(2 * kv_i + 1);
      }
      ++kv_i;
      SS_RETURN_IF_ERROR(
          FullAttentionBlock(layer, kvs, slices, mode, rows,
                             batch != nullptr ? &layer_batch : nullptr));
    } else {
      for (size_t i = 0; i < states.size(); ++i)
        linear[i] = &states[i]->linear_[lin_i];
      if (batch != nullptr) {
        layer_batch.conv = table(2 * nf + 2 * lin_i);
        layer_batch.recurrent = kv_table(2 * nf + 2 * lin_i + 1);
      }
      ++lin_i;
      // A verify's table (one row per column) is for attention only: the
      // linear layers run the one session's columns in order.
      SS_RETURN_IF_ERROR(LinearAttentionBlock(
          layer, linear, slices, mode, rows,
          batch != nullptr && mode == Mode::kCommit ? &layer_batch : nullptr));
    }
    SS_RETURN_IF_ERROR(MlpBlock(layer, mode, rows));
  }
  kernels::RmsNormParams norm;
  norm.rows = rows;
  norm.dim = c.hidden_size;
  norm.x = ws.h.f32();
  norm.x_stride = c.hidden_size;
  norm.y = ws.hidden.f32();
  norm.y_stride = c.hidden_size;
  norm.weight = weights_.final_norm.f32();
  norm.eps = c.rms_norm_eps;
  return backend_->RmsNorm(norm);
}

absl::Status Model::UploadIds(absl::Span<const int32_t> tokens) {
  return backend_->CopyToDevice(ws_->ids.data(), tokens.data(),
                                tokens.size() * sizeof(int32_t));
}

absl::Status Model::EmbedUploaded(int rows) {
  kernels::EmbedParams e;
  e.rows = rows;
  e.ids = static_cast<const int32_t*>(ws_->ids.data());
  e.table_dtype = weights_.embed.dtype;
  e.table_layout = weights_.embed.layout;
  e.table = weights_.embed.data;
  e.vocab = config_.vocab_size;
  e.dim = config_.hidden_size;
  e.out = ws_->h.f32();
  e.out_stride = config_.hidden_size;
  return backend_->Embed(e);
}

absl::Status Model::EmitRows(int row0, int n, ForwardResult* out) {
  SS_RETURN_IF_ERROR(LmHead(row0, n));
  return CopyRowsOut(row0, n, out);
}

absl::Status Model::LmHead(int row0, int n) {
  return LmHeadOf(ws_->hidden.f32() + row0 * config_.hidden_size, n);
}

absl::Status Model::LmHeadOf(const float* hidden, int n) {
  const int64_t V = config_.vocab_size;
  Workspace& ws = *ws_;
  CHECK(n >= 1 && n <= kMaxRows) << "lm_head rows " << n;
  SS_RETURN_IF_ERROR(backend_->Matmul(
      kernels::DenseMatmul(n, hidden, weights_.lm_head, ws.logits.f32())));
  kernels::ArgmaxParams am;
  am.rows = n;
  am.cols = V;
  am.x = ws.logits.f32();
  am.x_stride = V;
  am.out = static_cast<int32_t*>(ws.argmax.data());
  am.finite = am.out + n;
  return backend_->Argmax(am);
}

absl::Status Model::GatherMasks(const ForwardResult& r, int first, int n,
                                int logits_row0, PassMasks* masks) const {
  if (r.mask_rows.empty()) return absl::OkStatus();
  const int64_t W = kernels::TokenMaskWords(config_.vocab_size);
  if (r.mask_words.size() != r.mask_rows.size() * W) {
    return absl::InvalidArgumentError(
        absl::StrCat("token masks: ", r.mask_words.size(), " words for ",
                     r.mask_rows.size(), " rows of ", W, " words"));
  }
  for (size_t i = 0; i < r.mask_rows.size(); ++i) {
    const int row = r.mask_rows[i];
    if (row < first || row >= first + n) {
      return absl::InvalidArgumentError(
          absl::StrCat("token masks: row ", row, " outside the pass's rows [",
                       first, ", ", first + n, ")"));
    }
    masks->rows.push_back(logits_row0 + row - first);
    masks->words.insert(masks->words.end(), r.mask_words.begin() + i * W,
                        r.mask_words.begin() + (i + 1) * W);
  }
  return absl::OkStatus();
}

absl::Status Model::ApplyMasks(const PassMasks& masks) {
  if (masks.rows.empty()) return absl::OkStatus();
  kernels::TokenMaskParams p;
  p.rows = static_cast<int64_t>(masks.rows.size());
  p.cols = config_.vocab_size;
  p.x = ws_->logits.f32();
  p.x_stride = config_.vocab_size;
  p.row_index = masks.rows.data();
  p.allowed = masks.words.data();
  p.argmax = static_cast<int32_t*>(ws_->argmax.data());
  return backend_->MaskTokens(p);
}

absl::Status Model::CopyRowsOut(int row0, int n, ForwardResult* out) {
  const int64_t H = config_.hidden_size, V = config_.vocab_size;
  kernels::Backend& be = *backend_;
  Workspace& ws = *ws_;
  const size_t old = out->rows;
  PassMasks masks;
  SS_RETURN_IF_ERROR(GatherMasks(*out, static_cast<int>(old), n, 0, &masks));
  SS_RETURN_IF_ERROR(ApplyMasks(masks));
  out->rows += n;
  // Set here, not in LmHead: a replayed recording runs LmHead without
  // calling it, but every pass with outputs ends here.
  lm_head_rows_ = n;
  if (out->want_logits) {
    out->logits.resize(out->rows * V);
    SS_RETURN_IF_ERROR(be.CopyToHost(out->logits.data() + old * V,
                                     ws.logits.data(), n * V * sizeof(float)));
  }
  out->hidden.resize(out->rows * H);
  SS_RETURN_IF_ERROR(be.CopyToHost(out->hidden.data() + old * H,
                                   ws.hidden.f32() + row0 * H,
                                   n * H * sizeof(float)));
  // [argmax n | finite n] in one copy.
  std::vector<int32_t> flags(2 * n);
  SS_RETURN_IF_ERROR(be.CopyToHost(flags.data(), ws.argmax.data(),
                                   flags.size() * sizeof(int32_t)));
  out->argmax.resize(out->rows);
  out->finite.resize(out->rows);
  std::copy(flags.begin(), flags.begin() + n, out->argmax.begin() + old);
  std::copy(flags.begin() + n, flags.end(), out->finite.begin() + old);
  return absl::OkStatus();
}

absl::Status Model::SampleRows(
    absl::Span<const int32_t> rows,
    absl::Span<const sampling::SamplingConfig> configs,
    absl::Span<const float> uniforms, std::vector<int32_t>* tokens) {
  for (int32_t row : rows) {
    if (ws_ == nullptr || row < 0 || row >= lm_head_rows_) {
      return absl::OutOfRangeError(absl::StrCat("logits row ", row,
                                                ": the latest pass produced ",
                                                lm_head_rows_, " rows"));
    }
  }
  return SampleRowsOf(ws_ != nullptr ? ws_->logits.f32() : nullptr, rows,
                      configs, uniforms, tokens);
}

absl::StatusOr<int32_t> Model::SampleHostLogits(
    absl::Span<const float> logits, const sampling::SamplingConfig& config,
    float uniform) {
  const int64_t V = config_.vocab_size;
  if (static_cast<int64_t>(logits.size()) != V) {
    return absl::InvalidArgumentError(
        absl::StrCat("SampleHostLogits: ", logits.size(),
                     " logits for a vocabulary of ", V));
  }
  if (host_logits_row_.data() == nullptr) {
    SS_ASSIGN_OR_RETURN(host_logits_row_, backend_->AllocateFloats(V));
  }
  SS_RETURN_IF_ERROR(backend_->CopyToDevice(host_logits_row_.data(),
                                            logits.data(), V * sizeof(float)));
  std::vector<int32_t> token;
  SS_RETURN_IF_ERROR(
      SampleRowsOf(host_logits_row_.f32(), {0}, {config}, {uniform}, &token));
  return token[0];
}

absl::Status Model::SampleRowsOf(
    const float* x, absl::Span<const int32_t> rows,
    absl::Span<const sampling::SamplingConfig> configs,
    absl::Span<const float> uniforms, std::vector<int32_t>* tokens) {
  if (configs.size() != rows.size() || uniforms.size() != rows.size()) {
    return absl::InvalidArgumentError(
        "SampleRows: rows, configs and uniforms differ in size");
  }
  tokens->assign(rows.size(), -1);
  if (rows.empty()) return absl::OkStatus();
  kernels::SampleRowsParams p =
      kernels::DenseSampleRows(static_cast<int64_t>(rows.size()), x,
                               config_.vocab_size, rows.data(), configs.data());
  p.uniform = uniforms.data();
  p.token = tokens->data();
  return backend_->SampleRows(p);
}

absl::Status Model::CopyLogitsRow(int row, std::vector<float>* logits) const {
  if (ws_ == nullptr || row < 0 || row >= lm_head_rows_) {
    return absl::OutOfRangeError(absl::StrCat("logits row ", row,
                                              ": the latest pass produced ",
                                              lm_head_rows_, " rows"));
  }
  const int64_t V = config_.vocab_size;
  logits->resize(V);
  return backend_->CopyToHost(logits->data(), ws_->logits.f32() + row * V,
                              V * sizeof(float));
}

absl::Status Model::CheckPrefill(const ModelState& state,
                                 absl::Span<const int32_t> tokens) const {
  SS_RETURN_IF_ERROR(CheckResident(state));
  if (tokens.empty()) return absl::InvalidArgumentError("prefill: no tokens");
  if (state.verified_columns_ != 0) {
    return absl::FailedPreconditionError(
        "prefill: a verify is pending (commit or discard it first)");
  }
  SS_RETURN_IF_ERROR(CheckTokens(tokens));
  const int n = static_cast<int>(tokens.size());
  if (state.length_ + n > state.capacity_) {
    return absl::OutOfRangeError(
        absl::StrCat("prefill: ", state.length_, " committed + ", n,
                     " new rows exceed capacity ", state.capacity_));
  }
  return absl::OkStatus();
}

int Model::PrefillPassRows(int64_t position, int64_t left, int max_rows) {
  static_assert(kMaxRows % kernels::kPrefillDeltaRuleChunk == 0 &&
                    kMaxPrefillRows % kernels::kPrefillDeltaRuleChunk == 0,
                "passes cut at chunk boundaries");
  const int64_t to_boundary =
      max_rows - position % kernels::kPrefillDeltaRuleChunk;
  return static_cast<int>(std::min(left, to_boundary));
}

absl::Status Model::Prefill(ModelState* state, absl::Span<const int32_t> tokens,
                            const PrefillOptions& options, ForwardResult* out) {
  SS_RETURN_IF_ERROR(CheckPrefill(*state, tokens));
  const int n = static_cast<int>(tokens.size());
  out->Clear(options.all_rows ? state->length_ : state->length_ + n - 1);
  const int64_t H = config_.hidden_size;
  if (options.all_hidden != nullptr) options.all_hidden->resize(n * H);
  // Every row's logits need a logits row each: passes of kMaxRows then.
  const int pass = options.all_rows ? kMaxRows : kMaxPrefillRows;
  for (int i = 0, rows = 0; i < n; i += rows) {
    rows = PrefillPassRows(state->length_, n - i, pass);
    const Slice slice{0, rows, state->length_};
    SS_RETURN_IF_ERROR(RunTrunk(absl::MakeConstSpan(&state, 1),
                                absl::MakeConstSpan(&slice, 1),
                                tokens.subspan(i, rows), Mode::kPrefill));
    state->length_ += rows;
    if (options.all_hidden != nullptr) {
      SS_RETURN_IF_ERROR(
          backend_->CopyToHost(options.all_hidden->data() + i * H,
                               ws_->hidden.f32(), rows * H * sizeof(float)));
    }
    if (options.all_rows) {
      SS_RETURN_IF_ERROR(EmitRows(0, rows, out));
    } else if (i + rows == n) {
      SS_RETURN_IF_ERROR(EmitRows(rows - 1, 1, out));
    }
  }
  return absl::OkStatus();
}

absl::Status Model::Decode(ModelState* state, int32_t token,
                           ForwardResult* out) {
  const auto tokens = absl::MakeConstSpan(&token, 1);
  SS_RETURN_IF_ERROR(CheckPrefill(*state, tokens));
  out->Clear(state->length_);
  return DecodeStep(absl::MakeConstSpan(&state, 1), tokens, out);
}

absl::Status Model::Verify(ModelState* state, absl::Span<const int32_t> tokens,
                           ForwardResult* out) {
  SS_RETURN_IF_ERROR(CheckResident(*state));
  if (state->draft_freed_) {
    return absl::FailedPreconditionError(
        "verify: the draft state was freed (FreeDraftState)");
  }
  const int n = static_cast<int>(tokens.size());
  if (n < 1 || n > state->max_verify_columns_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "verify: ", n, " columns (1..", state->max_verify_columns_, ")"));
  }
  if (state->verified_columns_ != 0) {
    return absl::FailedPreconditionError("verify: a verify is already pending");
  }
  SS_RETURN_IF_ERROR(CheckTokens(tokens));
  if (state->length_ + n > state->capacity_) {
    return absl::OutOfRangeError(
        absl::StrCat("verify: ", state->length_, " committed + ", n,
                     " columns exceed capacity ", state->capacity_));
  }
  out->Clear(state->length_);
  if (GraphsApply(absl::MakeConstSpan(&state, 1))) {
    SS_RETURN_IF_ERROR(VerifyRecorded(state, tokens, out));
    state->verified_columns_ = n;
    return absl::OkStatus();
  }
  const Slice slice{0, n, state->length_};
  SS_RETURN_IF_ERROR(RunTrunk(absl::MakeConstSpan(&state, 1),
                              absl::MakeConstSpan(&slice, 1), tokens,
                              Mode::kVerify));
  state->verified_columns_ = n;
  return EmitRows(0, n, out);
}

}  // namespace specserve::model
