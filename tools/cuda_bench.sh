#!/usr/bin/env bash
# Build, check and time the CUDA backend in one GPU-machine call.
#
#   tools/cuda_bench.sh prepare   (build machine, with Bazel)
#       tools/cuda_check.sh prepare, plus //tools/cuda_bench and its
#       prefill_ops_bench and shared_pages_bench (same flags and output
#       base: --config=cuda --config=static), all into .carry/cuda/,
#       packed into .carry/pack/cuda.tar.xz (carry .carry/pack: the
#       binaries themselves exceed the travelling tree's 64 MiB). Also
#       tools/serve_bench's pack, .carry/serve/serve.tar.xz: the worker,
#       cuda_bench and //scheduler:specserve_scheduler (--define=static=1,
#       output base ${ob}_serve) with the shared libraries it loads (carry
#       .carry/serve for tools/serve_bench/run.sh).
#
#   tools/cuda_bench.sh [run]     (GPU machine, repository root; no Bazel)
#       1. checks: the op test (CPU vs CUDA, bit-exact row invariance),
#          sample_rows_test (device sampling == the host filters' tokens),
#          prefill_matmul_test / prefill_attention_test /
#          prefill_gated_delta_rule_test (the prefill forms within
#          tolerance of the CPU, row-invariant), the
#          model test (verify == decode bit-exact, CUDA vs CPU), specgen
#          cuda:0 vs cpu greedy ids, the CPU property tests built for CUDA
#          (batch_cuda_test: batched == alone, offload exact;
#          verify_batch_cuda_test, prefill_batch_cuda_test: batched passes
#          == each session alone; model_executor_cuda_test,
#          interleaved_prefill_cuda_test: gathering and chunked prefill;
#          recorded_steps_cuda_test: CUDA-graph steps == op by op, fallback;
#          spec_engine_cuda_test: spec == plain greedy, sampled
#          reproducible per seed and distributed as plain; CUDA_BENCH_CHI=0
#          skips the chi-square part), specserve_worker
#          --device cuda:0 coming up, compute-sanitizer memcheck on the
#          matmul/embed op tests (CUDA_BENCH_SANITIZE=0 skips it);
#          and mma_order_probe (informational: does wgmma sum a k16 slice
#          with mma.sync's bits?);
#       2. cuda_bench: copy bandwidth, matmul sweep, the random-weight
#          Qwen3.5-27B-shape model ((a) decode, (b) verify 2..8, (c)
#          DecodeBatch 1..64, (f) prefill of 64..2048 tokens), models/default decode and (d) plain vs
#          speculative engine bursts, each beside its floor (weight bytes /
#          copy bandwidth of the same run); sampling_cuda_bench (device
#          SampleRows against copy + host filters, tools/sampling_bench);
#          prefill_ops_bench (the prefill matmul, gated delta rule and
#          attention kernels at the 27B shapes); shared_pages_bench (what
#          allocating a session's caches and each virtual-memory driver
#          call of a fork cost);
#       3. (e) transformers generate on the same GPU
#          (tools/cuda_bench/hf_generate.py): greedy ids on models/default
#          against ours, tokens/s there and on the random 27B shape.
#   tools/cuda_bench.sh ab BASE NEW[,NEW2...] [ROUNDS]   (GPU machine, carry
#       .carry/ab) prepare also keeps each build's cuda_bench as
#       .carry/ab/<rev>.tar.xz; ab runs BASE and the NEW builds in turn on one
#       machine and prints the 27B-shape figures' medians and each NEW's ratio
#       to BASE ($OUT/ab.{txt,json}). The name `pack` is the build in
#       .carry/pack (carry it and one kept build: the pack and two builds pass
#       the travelling tree's 64 MiB), so that one call can check a build
#       (run) and time it against another.
#   tools/cuda_bench.sh envab ROUNDS 'BASE_ENV' 'NEW_ENV'  (GPU machine, carry
#       .carry/pack) the same comparison for one build under two environments
#       (VAR=value lists): for switches an experiment reads from its
#       environment.
#   tools/cuda_bench.sh sanitize  (GPU machine) compute-sanitizer memcheck,
#       racecheck and synccheck over the GPU tests: $OUT/sanitizers.txt.
#       Writes into $OUT (default /tmp/cuda_bench): checks.log,
#       cuda_bench.txt, cuda_bench.json, sampling_cuda_bench.{txt,json},
#       prefill_ops_bench.txt, shared_pages_bench.txt,
#       hf_generate.{txt,json}, summary.txt.
#       Exit 0 only if all passed.
set -uo pipefail
cd "$(dirname "$0")/.."
mode="${1:-run}"
carry=.carry/cuda

# prepare also packs the binaries (.carry/pack/cuda.tar.xz, a small part of
# their size: the working tree that travels is capped); the GPU machine unpacks
# them into $carry once.
untar() {  # ARCHIVE DIR
  mkdir -p "$2" &&
    python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$1" "$2"
}
unpack() {
  [ -x "$carry/cuda_bench" ] || [ ! -f .carry/pack/cuda.tar.xz ] ||
    untar .carry/pack/cuda.tar.xz "$carry"
}

if [ "$mode" = prepare ]; then
  CUDA_CHECK_NO_PACK=1 tools/cuda_check.sh prepare || exit 1
  ob="${CUDA_CHECK_OUTPUT_BASE:-$HOME/.cache/bazel_cuda/ob}"
  flags=(--config=cuda --config=static)
  bazel --output_base="$ob" build "${flags[@]}" --symlink_prefix=/ //tools/cuda_bench \
    //tools/cuda_bench:mma_order_probe //tools/cuda_bench:prefill_ops_bench \
    //tools/cuda_bench:shared_pages_bench //tools/sampling_bench:sampling_cuda_bench || exit 1
  bin="$(bazel --output_base="$ob" info "${flags[@]}" bazel-bin 2>/dev/null)" || exit 1
  for b in cuda_bench/cuda_bench cuda_bench/mma_order_probe cuda_bench/prefill_ops_bench \
      cuda_bench/shared_pages_bench sampling_bench/sampling_cuda_bench; do
    rm -f "$carry/${b#*/}"
    cp "$bin/tools/$b" "$carry/${b#*/}" && chmod u+w,a+x "$carry/${b#*/}" || exit 1
  done
  mkdir -p .carry/pack
  # (-9 -T1: see tools/cuda_check.sh prepare)
  tar -C "$carry" -cf - $(cd "$carry" && ls) | xz -9 -T1 > .carry/pack/cuda.tar.xz || exit 1
  # tools/serve_bench's own pack, carried instead of .carry/pack (with it the
  # tree would pass 64 MiB): the worker, cuda_bench, the scheduler, and the
  # shared libraries the scheduler still loads (libcpp-httplib has no static
  # archive; it brings OpenSSL, zlib, Brotli, libstdc++) in lib/. The
  # scheduler is built with --define=static=1 alone (its own output base):
  # --config=static also links libstdc++ statically, and that second copy
  # beside libcpp-httplib's libstdc++.so breaks its iostreams (every log line
  # stops after its first character).
  sob="${ob}_serve"
  bazel --output_base="$sob" build --define=static=1 --symlink_prefix=/ \
    //scheduler:specserve_scheduler || exit 1
  sbin="$(bazel --output_base="$sob" info --define=static=1 bazel-bin 2>/dev/null)" || exit 1
  sb=.carry/serve_bin
  rm -rf "$sb" && mkdir -p "$sb/lib" || exit 1
  cp "$carry/specserve_worker" "$carry/cuda_bench" "$sbin/scheduler/specserve_scheduler" "$sb/" &&
    chmod u+w,a+x "$sb"/specserve_* "$sb/cuda_bench" || exit 1
  ldd "$sb/specserve_scheduler" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
    grep -vE '/(libc|libm|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$sb/lib/" || exit 1; done || exit 1
  mkdir -p .carry/serve
  tar -C "$sb" -cf - . | xz -6 -T2 > .carry/serve/serve.tar.xz || exit 1
  # This build's cuda_bench, kept by revision for `ab` (the newest 6 of those
  # named by revision; a build kept under another name, e.g. an A/B base
  # named by hand, stays: prepare once pruned a base before its A/B ran).
  rev="$(git rev-parse --short=8 HEAD)"
  [ -z "$(git status --porcelain --untracked-files=no)" ] || rev="$rev-dirty"
  mkdir -p .carry/ab
  tar -C "$carry" -cf - cuda_bench | xz -6 -T2 > ".carry/ab/$rev.tar.xz" || exit 1
  ls -t .carry/ab/*.tar.xz | grep -E '/[0-9a-f]{8}(-dirty)?\.tar\.xz$' | tail -n +7 |
    xargs -r rm -f
  echo "kept .carry/ab/$rev.tar.xz for: tools/cuda_bench.sh ab BASE $rev"
  du -sh "$carry" .carry/pack .carry/ab .carry/serve
  exit 0
fi
if [ "$mode" = ab ]; then
  # A/B on one machine (carry .carry/ab): the 27B-shape model figures of
  # kept builds, run in turn ROUNDS times each, medians and ratios to BASE
  # (tools/cuda_bench/ab_compare.py). NEW may list several builds, comma
  # separated (about 15 s per build and round). Machines of different device
  # calls differ by ~1.5%, more than most single changes: compare within a
  # call.
  base="${2:?usage: $0 ab BASE NEW[,NEW2...] [ROUNDS] (names of .carry/ab/*.tar.xz)}"
  new="${3:?usage: $0 ab BASE NEW[,NEW2...] [ROUNDS]}"
  rounds="${4:-2}"
  IFS=, read -r -a news <<< "$new"
  out="${OUT:-/tmp/cuda_bench}"
  mkdir -p "$out"
  bench_of() {  # the cuda_bench binary of build $1
    if [ "$1" = pack ]; then echo "$carry/cuda_bench"; else echo ".carry/ab_bin/$1/cuda_bench"; fi
  }
  for b in "$base" "${news[@]}"; do
    if [ "$b" = pack ]; then
      unpack || exit 1
    else
      untar ".carry/ab/$b.tar.xz" ".carry/ab_bin/$b" || exit 1
    fi
  done
  files=()
  for i in $(seq 1 "$rounds"); do
    for b in "$base" "${news[@]}"; do
      echo "== $b, round $i"
      timeout 200 "$(bench_of "$b")" --skip_matmul --json="$out/${b}_$i.json" \
        > "$out/${b}_$i.txt" 2>&1 || { echo "cuda_bench $b failed"; tail -5 "$out/${b}_$i.txt"; exit 1; }
      grep -E "^\(a\)|greedy \(no" "$out/${b}_$i.txt"
      files+=("$out/${b}_$i.json")
    done
  done
  python3 tools/cuda_bench/ab_compare.py "$base" "$new" "$out/ab.json" "${files[@]}" |
    tee "$out/ab.txt"
  status="${PIPESTATUS[0]}"
  exit "$status"
fi
case "$mode" in run|sanitize|envab) ;; *) echo "usage: $0 [prepare|run|sanitize|ab|envab]" >&2; exit 2 ;; esac

unpack || exit 1  # (carry .carry/pack alone)
out="${OUT:-/tmp/cuda_bench}"
mkdir -p "$out"

if [ "$mode" = envab ]; then
  # One build (carry .carry/pack) under two environments, run alternately on
  # one machine, compared like `ab`: for switches a build reads from its
  # environment (an experiment branch's knobs).
  rounds="${2:?usage: $0 envab ROUNDS 'BASE_ENV' 'NEW_ENV' (VAR=value ..., may be empty)}"
  base_env="${3-}" new_env="${4-}"
  files=()
  for i in $(seq 1 "$rounds"); do
    for b in base new; do
      e="$base_env"; [ "$b" = new ] && e="$new_env"
      echo "== $b ($e), round $i"
      # (word splitting of $e is wanted: VAR=value pairs)
      # shellcheck disable=SC2086
      env $e timeout 200 "$carry/cuda_bench" --skip_matmul --json="$out/${b}_$i.json" \
        > "$out/${b}_$i.txt" 2>&1 || { echo "cuda_bench ($e) failed"; tail -5 "$out/${b}_$i.txt"; exit 1; }
      grep -E "greedy \(no" "$out/${b}_$i.txt"
      files+=("$out/${b}_$i.json")
    done
  done
  python3 tools/cuda_bench/ab_compare.py base new "$out/ab.json" "${files[@]}" | tee "$out/ab.txt"
  exit "${PIPESTATUS[0]}"
fi

if [ "$mode" = sanitize ]; then
  # compute-sanitizer over the GPU test cases: memcheck of the op, model,
  # exactness and recorded-step tests; racecheck and synccheck of the
  # kernels with shared-memory staging (matmul, delta rule, attention,
  # norms, reductions). Writes $out/sanitizers.txt; exit 0 only if clean.
  cs="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  # (the full Matmul sweep is too slow under racecheck: the fused cases
  # cover both x paths, the staged and the pre-split one at 64 rows)
  shared='*MatmulFused*:*MatmulLoadPaths*:*GatedDeltaRule*:*Attention*:*RmsNorm*:*Argmax*:*Conv1d*'
  # Racecheck in two runs, each under its own timeout: the attention tests
  # alone take ~100 s there (one run of all of them timed out).
  rest='*MatmulFused*:*MatmulLoadPaths*:*GatedDeltaRule*:*RmsNorm*:*Argmax*:*Conv1d*:*AttentionInputs*'
  runs=("memcheck cuda_backend_test *" "memcheck cuda_model_test *"
        "memcheck exactness_cuda_test *" "memcheck recorded_steps_cuda_test *"
        "racecheck cuda_backend_test $rest"
        # (CudaBackendTest.Attention alone took 131 s under racecheck on
        # 2026-12-01: it runs alone)
        "racecheck cuda_backend_test *.Attention"
        "racecheck cuda_backend_test *Attention*:-*AttentionInputs*:*.Attention"
        "synccheck cuda_backend_test $shared"
        "memcheck sample_rows_test *" "synccheck sample_rows_test *"
        # (the 248,320-wide draws take over 140 s under racecheck; these
        # cover every path at 50,000, 2,053 and 300 columns)
        "racecheck sample_rows_test *RowsAreInvariant*:*BadRows*:")
  fail=0
  : > "$out/sanitizers.txt"
  n=0
  for r in "${runs[@]}"; do
    read -r tool t filter <<< "$r"
    n=$((n + 1))
    # CUDA_SANITIZE_TOOLS="racecheck synccheck" runs only those tools.
    case " ${CUDA_SANITIZE_TOOLS:-memcheck racecheck synccheck} " in *" $tool "*) ;; *) continue ;; esac
    log="/tmp/san_${n}_${tool}_${t}.log"
    timeout "${CUDA_SANITIZE_TIMEOUT:-200}" "$cs" --tool "$tool" --error-exitcode 99 \
      --print-limit 10 "$carry/$t" --gtest_filter="$filter" > "$log" 2>&1
    rc=$?
    { echo "===== $tool $t ($filter): rc=$rc$([ $rc = 124 ] && echo ' (timed out)')"
      grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|Invalid|^\[  (PASSED|FAILED)" \
        "$log" | head -12; } >> "$out/sanitizers.txt"
    [ $rc = 0 ] || fail=1
  done
  cat "$out/sanitizers.txt"
  exit $fail
fi
failed=0
summary=()
note() { summary+=("$1 rc=$2"); [ "$2" = 0 ] || failed=1; }
counts() { grep -E "^\[==========\]|^\[  PASSED  \]|^\[  FAILED  \]" "$1"; }

nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv \
  > "$out/checks.log" 2>&1
{
  echo "== cuda_backend_test"
  timeout 90 "$carry/cuda_backend_test" > /tmp/cb_op.log 2>&1; rc=$?
  grep -E "^\[  FAILED  \]|Failure|worst at|Expected|Which is|MISMATCH" /tmp/cb_op.log | head -30
  counts /tmp/cb_op.log; echo "rc=$rc"
} >> "$out/checks.log"; note cuda_backend_test $rc
{
  echo "== cuda_model_test"
  timeout 90 "$carry/cuda_model_test" > /tmp/cb_model.log 2>&1; rc=$?
  grep -E "^\[  FAILED  \]|Failure|cuda-vs-cpu|Expected|Which is" /tmp/cb_model.log | head -30
  counts /tmp/cb_model.log; echo "rc=$rc"
} >> "$out/checks.log"; note cuda_model_test $rc
# The CPU targets' property tests, on the GPU (same sources, CUDA backend);
# the engine's chi-square test (thousands of bursts) runs last, on its own.
# CUDA_BENCH_CHI=0 skips the chi-square step (about 100 s).
steps=("sample_rows_test 90 *" "prefill_matmul_test 120 *" "prefill_attention_test 120 *"
       "prefill_gated_delta_rule_test 120 *"
       "exactness_cuda_test 90 *" "batch_cuda_test 90 *" "recorded_steps_cuda_test 90 *"
       "verify_batch_cuda_test 90 *" "prefill_batch_cuda_test 90 *"
       "model_executor_cuda_test 90 *" "interleaved_prefill_cuda_test 90 *"
       "spec_engine_cuda_test 120 -*SampledDistribution*")
[ "${CUDA_BENCH_CHI:-1}" != 0 ] &&
  steps+=("spec_engine_cuda_test ${CUDA_BENCH_CHI_TIMEOUT:-240} *SampledDistribution*")
for step in "${steps[@]}"; do
  read -r t secs filter <<< "$step"
  {
    echo "== $t --gtest_filter=$filter"
    timeout "$secs" "$carry/$t" --gtest_filter="$filter" > "/tmp/cb_$t.log" 2>&1; rc=$?
    grep -E "^\[  FAILED  \]|Failure|Expected|Which is|^chi2|SKIPPED|draws differ" "/tmp/cb_$t.log" | head -30
    grep -E "^\[       OK \]" "/tmp/cb_$t.log" | sed 's/^\[       OK \] //' | tr '\n' ';' | head -c 3000; echo
    counts "/tmp/cb_$t.log"; echo "rc=$rc"
  } >> "$out/checks.log"; note "$t $filter" $rc
done
prompt=1,324,313,2765,5811,7,2365,11,1871,323,258,744,269,1479,1
for dev in cuda:0 cpu; do
  # fp32 KV on both: the CPU oracle's cache type (bf16 is compared below)
  timeout 30 "$carry/specgen" --model models/default --prompt-ids "$prompt" --max-new 128 \
    --ignore-eos --device "$dev" --kv_cache_dtype=fp32 > "/tmp/cb_sg_${dev%%:*}.txt" 2>&1
done
g=$(sed -n 's/^ids: //p' /tmp/cb_sg_cuda.txt); c=$(sed -n 's/^ids: //p' /tmp/cb_sg_cpu.txt)
{ echo "== specgen cuda:0 vs cpu"; grep -E "^prefill|^decode" /tmp/cb_sg_cuda.txt; } >> "$out/checks.log"
if [ -n "$g" ] && [ "$g" = "$c" ]; then note "specgen ids cuda == cpu" 0; else note "specgen ids cuda == cpu" 1; fi
# Informational: how far bf16-KV greedy decode (the worker's default on
# CUDA) follows fp32-KV decode on models/default.
timeout 200 python3 tools/cuda_bench/kv_dtype_agreement.py --specgen "$carry/specgen" \
  --model models/default --device cuda:0 --max-new 128 --out "$out" > /dev/null 2>&1
echo "== bf16-KV vs fp32-KV greedy: rc=$? ($(tail -1 "$out/kv_dtype_agreement.txt" 2>/dev/null))" \
  >> "$out/checks.log"
# The worker serves on the GPU: --device cuda:0 comes up (listening line),
# cuda:9 fails cleanly.
{
  echo "== specserve_worker --device cuda:0"
  timeout 60 "$carry/specserve_worker" --model models/default --device cuda:0 \
    --listen 127.0.0.1:0 > /tmp/cb_worker.out 2> /tmp/cb_worker.err &
  wpid=$!
  for _ in $(seq 1 100); do grep -q listening /tmp/cb_worker.out && break; sleep 0.5; done
  cat /tmp/cb_worker.out; grep -E "device|loaded|step cost" /tmp/cb_worker.err | head -5
  grep -q listening /tmp/cb_worker.out; rc=$?
  kill -TERM $wpid 2>/dev/null; wait $wpid 2>/dev/null
  echo "rc=$rc"
  echo "== specserve_worker --device cuda:9 (must fail cleanly)"
  timeout 20 "$carry/specserve_worker" --model models/default --device cuda:9 \
    --listen 127.0.0.1:0 2>&1 | tail -2; echo "rc=${PIPESTATUS[0]}"
} >> "$out/checks.log" 2>&1; note "specserve_worker --device cuda:0 serves" $rc
cs="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
if [ "${CUDA_BENCH_SANITIZE:-1}" != 0 ] && [ -x "$cs" ]; then
  timeout 90 "$cs" --tool memcheck --error-exitcode 99 --print-limit 10 "$carry/cuda_backend_test" \
    --gtest_filter='*Matmul*:*SwigluAndEmbed*' > /tmp/cb_san.log 2>&1; rc=$?
  { echo "== memcheck matmul/embed"; grep -E "ERROR SUMMARY|Invalid|^\[  (PASSED|FAILED)" /tmp/cb_san.log | head; } >> "$out/checks.log"
  note "memcheck matmul/embed" $rc
fi
# Facts for the next kernel (informational, not a check): does wgmma sum a
# k16 slice with mma.sync's bits?
timeout 60 "$carry/mma_order_probe" > "$out/mma_order_probe.txt" 2>&1
echo "== mma_order_probe: rc=$? ($(tail -1 "$out/mma_order_probe.txt"))" >> "$out/checks.log"
cat "$out/checks.log"

echo "== cuda_bench"
timeout "${CUDA_BENCH_TIMEOUT:-240}" "$carry/cuda_bench" --json="$out/cuda_bench.json" \
  --default_model=models/default ${CUDA_BENCH_ARGS:-} 2>&1 | tee "$out/cuda_bench.txt"
rc=${PIPESTATUS[0]}; note cuda_bench $rc
echo "== sampling: device SampleRows vs copy + host filters"
timeout 120 "$carry/sampling_cuda_bench" --json_out="$out/sampling_cuda_bench.json" 2>&1 |
  tee "$out/sampling_cuda_bench.txt"
rc=${PIPESTATUS[0]}; note sampling_cuda_bench $rc
echo "== prefill kernels at the 27B shapes: matmul, gated delta rule, attention"
timeout 120 "$carry/prefill_ops_bench" 2>&1 | tee "$out/prefill_ops_bench.txt"
rc=${PIPESTATUS[0]}; note prefill_ops_bench $rc
echo "== shared pages: allocation and virtual-memory driver call costs"
timeout 60 "$carry/shared_pages_bench" 2>&1 | tee "$out/shared_pages_bench.txt"
rc=${PIPESTATUS[0]}; note shared_pages_bench $rc
# (e) Hugging Face transformers on the same GPU, same run: greedy on
# models/default (same ids as ours?) and the 27B shape with random bf16
# weights (CUDA_BENCH_HF=0 skips).
if [ "${CUDA_BENCH_HF:-1}" != 0 ] && command -v python3 > /dev/null; then
  echo "== (e) transformers generate"
  grep '^ids: ' /tmp/cb_sg_cuda.txt > /tmp/cb_our_ids.txt
  PYTHONUNBUFFERED=1 timeout "${CUDA_BENCH_HF_TIMEOUT:-200}" python3 tools/cuda_bench/hf_generate.py \
    --json "$out/hf_generate.json" --default-model models/default --prompt-ids "$prompt" \
    --max-new 128 --our-ids-file /tmp/cb_our_ids.txt --big --big-new 8 2>&1 |
    grep -v -E "falling back|Loading weights|^\s*$" | tee "$out/hf_generate.txt"
  rc=${PIPESTATUS[0]}; note "hf_generate" $rc
fi
{
  for s in "${summary[@]}"; do echo "$s"; done
  echo "overall: $([ $failed = 0 ] && echo PASS || echo FAIL)"
} | tee "$out/summary.txt"
exit $failed
