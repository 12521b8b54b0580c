# The libFuzzer targets and the product sources each one links: the one place
# these lists live (sourced by tools/fuzz/build.sh and tools/fuzz/run.sh).
# The lists follow the cc_library srcs in the BUILD files of the folders they
# name; a source added there without being added here shows up as an
# undefined symbol when build.sh links.
#
# FUZZ_TARGETS: target names, in the order run.sh runs them. Target T is
# tools/fuzz/T_fuzzer.cc linked with the sources in FUZZ_SRCS_T (paths from
# the repository root; "gen/proto/X.pb.cc" is protoc's output for
# proto/X.proto).

FUZZ_TARGETS=(request_validation tokenizer model_files burst_request)

# //scheduler:request_validation + //scheduler:request_parsing; the sampling
# filters' and logit controls' validation (//kernels/sampling) for the
# scheduler-accepts => worker-accepts check.
FUZZ_SRCS_request_validation=(
  gen/proto/specserve.pb.cc
  scheduler/request_validation.cc
  scheduler/request_parsing.cc
  kernels/sampling/logit_adjust.cc
  kernels/sampling/sampling.cc
)

# //scheduler/tokenizer
FUZZ_SRCS_tokenizer=(
  scheduler/tokenizer/added_tokens.cc
  scheduler/tokenizer/bpe.cc
  scheduler/tokenizer/byte_level.cc
  scheduler/tokenizer/pre_tokenizer.cc
  scheduler/tokenizer/streaming_detokenizer.cc
  scheduler/tokenizer/tokenizer.cc
  scheduler/tokenizer/tokenizer_json.cc
  scheduler/tokenizer/unicode.cc
)

# //kernels (what //worker/model_files and //worker/model depend on) and
# //kernels/sampling.
FUZZ_KERNELS=(
  kernels/attention.cc
  kernels/attention_inputs.cc
  kernels/backend.cc
  kernels/conv1d.cc
  kernels/embed.cc
  kernels/gated_delta_rule.cc
  kernels/matmul.cc
  kernels/reduce.cc
  kernels/rms_norm.cc
  kernels/rope.cc
  kernels/sample_rows.cc
  kernels/scatter_rows.cc
  kernels/swiglu.cc
  kernels/token_mask.cc
  kernels/types.cc
  kernels/sampling/logit_adjust.cc
  kernels/sampling/sampling.cc
)

# //worker/model_files
FUZZ_MODEL_FILES=(
  worker/model_files/checkpoint.cc
  worker/model_files/json_util.cc
  worker/model_files/model_config.cc
  worker/model_files/safetensors.cc
)
FUZZ_SRCS_model_files=("${FUZZ_MODEL_FILES[@]}" "${FUZZ_KERNELS[@]}")

# @xgrammar (tools/bazel/xgrammar.BUILD): its C++ core from the sdist that
# tools/install_deps unpacks, every cpp/**/*.cc but the Python bindings, one
# of them patched (build.sh writes gen/xgrammar/json_schema_converter.cc as
# the Bazel genrule does).
FUZZ_XGRAMMAR_DIR=.deps/xgrammar
mapfile -t FUZZ_XGRAMMAR < <(find "$FUZZ_XGRAMMAR_DIR/cpp" -name '*.cc' \
  -not -path '*/tvm_ffi/*' -not -name json_schema_converter.cc | sort)
FUZZ_XGRAMMAR+=(gen/xgrammar/json_schema_converter.cc)

# worker/burst_request + //worker:session_pool + //worker/spec:spec_engine +
# //worker/grammar (with @xgrammar) + //worker/model +
# //kernels + //kernels/cpu + //kernels/sampling + //telemetry:spec_telemetry
# + //telemetry:constant_time + //worker/model_files and the protos.
FUZZ_SRCS_burst_request=(
  gen/proto/specserve.pb.cc
  gen/proto/worker.pb.cc
  worker/burst_request.cc
  worker/session_pool.cc
  worker/spec/live_step_costs.cc
  worker/spec/logprobs.cc
  worker/spec/model_executor.cc
  worker/spec/spec_accept.cc
  worker/spec/round_group.cc
  worker/spec/spec_engine.cc
  worker/spec/spec_session.cc
  worker/spec/row_controls.cc
  worker/grammar/grammar.cc
  worker/grammar/grammar_cursor.cc
  "${FUZZ_XGRAMMAR[@]}"
  worker/model/batch.cc
  worker/model/blocks.cc
  worker/model/decode_step.cc
  worker/model/fork.cc
  worker/model/model.cc
  worker/model/mtp.cc
  worker/model/mtp_batch.cc
  worker/model/pool.cc
  worker/model/prefill_batch.cc
  worker/model/state.cc
  worker/model/verify_batch.cc
  worker/model/weights.cc
  "${FUZZ_MODEL_FILES[@]}"
  telemetry/constant_time.cc
  telemetry/spec_telemetry.cc
  "${FUZZ_KERNELS[@]}"
  kernels/cpu/attention.cc
  kernels/cpu/conv1d.cc
  kernels/cpu/cpu_backend.cc
  kernels/cpu/embed.cc
  kernels/cpu/chunked_delta_rule.cc
  kernels/cpu/gated_delta_rule.cc
  kernels/cpu/matmul.cc
  kernels/cpu/reduce.cc
  kernels/cpu/rms_norm.cc
  kernels/cpu/rope.cc
  kernels/cpu/simd.cc
  kernels/cpu/swiglu.cc
  kernels/cpu/thread_pool.cc
)

# Sources compiled with g++ (no instrumentation) instead of clang: clang 14
# does not know __builtin_cpu_supports("f16c") (kernels/cpu/simd.cc).
FUZZ_GXX_SRCS=(kernels/cpu/simd.cc)

# Debian libraries each target links (Abseil is added to all: the -labsl_*
# list of the top-level BUILD).
FUZZ_LIBS_request_validation=(-lgrpc++ -lgrpc -lgpr -lprotobuf -lglog)
FUZZ_LIBS_tokenizer=(-lpcre2-8 -lglog)
FUZZ_LIBS_model_files=(-lglog)
FUZZ_LIBS_burst_request=(-lprotobuf -lglog -lcrypto)
