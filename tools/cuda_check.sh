#!/usr/bin/env bash
# The CUDA backend's and the CUDA model forward's checks on the GPU machine,
# from binaries built here.
#
#   tools/cuda_check.sh prepare   (on the build machine, with Bazel)
#       Builds //kernels/cuda:cuda_backend_test, :shared_pages_test,
#       :prefill_matmul_test,
#       :prefill_attention_test, :prefill_gated_delta_rule_test,
#       //tools/cuda_bench:matmul_bench,
#       //worker/model:cuda_model_test, :exactness_cuda_test, :batch_cuda_test,
#       :recorded_steps_cuda_test, :verify_batch_cuda_test,
#       :prefill_batch_cuda_test, :fork_cuda_test, :shared_fork_cuda_test,
#       //worker:session_fork_cuda_test, //worker/spec:spec_engine_cuda_test,
#       :model_executor_cuda_test, :interleaved_prefill_cuda_test, //tools/specgen and
#       //worker:specserve_worker with --config=cuda
#       --config=static (only glibc, libm, libgcc_s and the NVIDIA driver
#       needed at run time; cudart is linked statically) and copies them to
#       .carry/cuda/ (git-ignored), packed into .carry/pack/cuda.tar.xz:
#       carry .carry/pack (run unpacks it). The build uses its own output base
#       ($CUDA_CHECK_OUTPUT_BASE, default ~/.cache/bazel_cuda/ob) and makes no
#       bazel-* links, so it neither evicts nor repoints the workspace's
#       default (CPU) build.
#
#   tools/cuda_check.sh [run]     (on the GPU machine, from the repository
#                                  root's copy: no Bazel needed)
#       Runs the carried binaries and writes into $OUT (default
#       /tmp/cuda_check) at most 10 files:
#         nvidia-smi.txt, sample_rows_test.log (device sampling == the host
#         filters' tokens), cuda_backend_test.log (op test: CPU vs CUDA, row
#         invariance), matmul_bench.txt (GEMV vs copy bandwidth, same run),
#         cuda_model_test.log (model on CUDA vs CPU; .exactness.log:
#         verify == decode, prefill == decode on the GPU), specgen.txt (greedy ids on cuda:0
#         vs cpu on models/default, tokens/s), sanitizers.log (unless
#         CUDA_CHECK_SANITIZE=0: compute-sanitizer memcheck on the op test
#         and on the model test, racecheck and synccheck on the
#         shared-memory kernels), xml.tgz (gtest XML), and summary.txt last.
#       Exit status: 0 only if every step passed. Every step has its own
#       timeout; they add up to about 11 minutes, so a run where most steps
#       time out can exceed one device call (600 s).
set -uo pipefail
cd "$(dirname "$0")/.."
mode="${1:-run}"
carry=.carry/cuda
bins="cuda_backend_test shared_pages_test sample_rows_test prefill_matmul_test prefill_attention_test prefill_gated_delta_rule_test matmul_bench cuda_model_test exactness_cuda_test batch_cuda_test recorded_steps_cuda_test verify_batch_cuda_test prefill_batch_cuda_test spec_engine_cuda_test model_executor_cuda_test interleaved_prefill_cuda_test fork_cuda_test shared_fork_cuda_test session_fork_cuda_test specgen specserve_worker"

if [ "$mode" = prepare ]; then
  ob="${CUDA_CHECK_OUTPUT_BASE:-$HOME/.cache/bazel_cuda/ob}"
  flags=(--config=cuda --config=static)
  bazel --output_base="$ob" build "${flags[@]}" --symlink_prefix=/ \
      //kernels/cuda:cuda_backend_test //kernels/cuda:sample_rows_test \
      //kernels/cuda:shared_pages_test \
      //worker/model:fork_cuda_test //worker/model:shared_fork_cuda_test \
      //worker:session_fork_cuda_test \
      //kernels/cuda:prefill_matmul_test //kernels/cuda:prefill_attention_test \
      //kernels/cuda:prefill_gated_delta_rule_test \
      //tools/cuda_bench:matmul_bench \
      //worker/model:cuda_model_test //worker/model:exactness_cuda_test \
      //worker/model:batch_cuda_test //worker/model:recorded_steps_cuda_test \
      //worker/model:verify_batch_cuda_test //worker/model:prefill_batch_cuda_test \
      //worker/spec:spec_engine_cuda_test //worker/spec:model_executor_cuda_test \
      //worker/spec:interleaved_prefill_cuda_test //tools/specgen \
      //worker:specserve_worker || exit 1
  bin="$(bazel --output_base="$ob" info "${flags[@]}" bazel-bin 2>/dev/null)" || exit 1
  mkdir -p "$carry"
  for b in $bins; do
    case $b in
      cuda_backend_test|shared_pages_test|sample_rows_test|prefill_matmul_test|\
      prefill_attention_test|prefill_gated_delta_rule_test)
        src="$bin/kernels/cuda/$b" ;;
      matmul_bench) src="$bin/tools/cuda_bench/$b" ;;
      cuda_model_test|exactness_cuda_test|batch_cuda_test|recorded_steps_cuda_test|\
      verify_batch_cuda_test|prefill_batch_cuda_test|fork_cuda_test|shared_fork_cuda_test)
        src="$bin/worker/model/$b" ;;
      spec_engine_cuda_test|model_executor_cuda_test|interleaved_prefill_cuda_test)
        src="$bin/worker/spec/$b" ;;
      specgen) src="$bin/tools/specgen/$b" ;;
      specserve_worker|session_fork_cuda_test) src="$bin/worker/$b" ;;
      *) echo "cuda_check: no build path for $b" >&2; exit 1 ;;
    esac
    rm -f "$carry/$b"
    cp "$src" "$carry/$b" && chmod u+w,a+x "$carry/$b" || exit 1
  done
  ls -la "$carry"
  # The binaries outgrow the travelling tree's cap (64 MiB): carry this
  # pack instead; run unpacks it. One xz stream with a 64 MiB dictionary
  # (-9, one thread) finds the binaries' common parts across files: about a
  # thirtieth of their size, where -6 (8 MiB, per-thread blocks) left a
  # seventh, over the cap. CUDA_CHECK_NO_PACK=1 skips it (cuda_bench.sh
  # packs once after adding its own binaries).
  if [ -z "${CUDA_CHECK_NO_PACK:-}" ]; then
    mkdir -p .carry/pack
    tar -C "$carry" -cf - $(cd "$carry" && ls) | xz -9 -T1 > .carry/pack/cuda.tar.xz || exit 1
    du -sh "$carry" .carry/pack
  fi
  exit 0
fi

if [ "$mode" != run ]; then
  echo "usage: $0 [prepare|run]" >&2
  exit 2
fi

if [ ! -x "$carry/specgen" ] && [ -f .carry/pack/cuda.tar.xz ]; then
  mkdir -p "$carry"
  python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
    .carry/pack/cuda.tar.xz "$carry" || exit 1
fi
out="${OUT:-/tmp/cuda_check}"
mkdir -p "$out"
xml=/tmp/cuda_check_xml
rm -rf "$xml" && mkdir -p "$xml"
for b in $bins; do
  if [ ! -x "$carry/$b" ]; then
    echo "missing $carry/$b: run '$0 prepare' on the build machine and carry .carry" |
      tee "$out/summary.txt"
    exit 1
  fi
done

{ nvidia-smi; nvidia-smi -q -d CLOCK | head -40; } > "$out/nvidia-smi.txt" 2>&1
summary=()
failed=0
note() {  # note NAME RC: one summary line; any non-zero rc fails the run
  summary+=("$1 rc=$2")
  [ "$2" = 0 ] || failed=1
}
gtest_counts() {
  grep -E "^\[==========\]|^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \] [0-9]" "$1"
}

# gtest_step NAME SECS PATTERN: $carry/NAME into $out/NAME.log (gtest XML in
# $xml), its rc noted; prints the lines matching PATTERN and the counts.
gtest_step() {
  echo "== $1"
  timeout "$2" "$carry/$1" --gtest_output="xml:$xml/$1.xml" > "$out/$1.log" 2>&1
  note "$1" $?
  grep -E "$3" "$out/$1.log" | head -40
  gtest_counts "$out/$1.log"
}

gtest_step sample_rows_test 90 "^\[  FAILED  \]|Failure|draws differ"
gtest_step cuda_backend_test 60 "^\[  FAILED  \]|Failure|worst at|Expected|Which is"

echo "== matmul_bench"
timeout 30 "$carry/matmul_bench" > "$out/matmul_bench.txt" 2>&1
rc=$?; note matmul_bench $rc
cat "$out/matmul_bench.txt"

gtest_step cuda_model_test 60 "^\[  FAILED  \]|Failure|cuda-vs-cpu|Expected|Which is"
# Forks: exact copies, and on the GPU the prefix's attention pages shared.
gtest_step shared_pages_test 120 "^\[  FAILED  \]|Failure"
gtest_step fork_cuda_test 120 "^\[  FAILED  \]|Failure"
gtest_step shared_fork_cuda_test 120 "^\[  FAILED  \]|Failure"
gtest_step session_fork_cuda_test 180 "^\[  FAILED  \]|Failure"
echo "== exactness_cuda_test"
timeout 90 "$carry/exactness_cuda_test" > "$out/cuda_model_test.exactness.log" 2>&1
rc=$?; note exactness_cuda_test $rc
gtest_counts "$out/cuda_model_test.exactness.log"

echo "== specgen on models/default: cuda:0 vs cpu"
prompt=1,324,313,2765,5811,7,2365,11,1871,323,258,744,269,1479,1
{
  # cuda:0 twice: the second run shows the timing's spread.
  for dev in cuda:0 cpu cuda:0; do
    echo "-- --device $dev"
    timeout 15 "$carry/specgen" --model models/default --prompt-ids "$prompt" \
      --max-new 128 --ignore-eos --device "$dev"
    echo "rc=$?"
  done
  echo "-- --device cuda:9 (no such device: must fail cleanly)"
  timeout 15 "$carry/specgen" --model models/default --prompt-ids 1 --max-new 1 \
    --device cuda:9
  echo "rc=$?"
} > "$out/specgen.txt" 2>&1
ids_gpu=$(sed -n '/^-- --device cuda:0/,/^rc=/s/^ids: //p' "$out/specgen.txt" | head -1)
ids_cpu=$(sed -n '/^-- --device cpu/,/^rc=/s/^ids: //p' "$out/specgen.txt")
if [ -n "$ids_gpu" ] && [ "$ids_gpu" = "$ids_cpu" ]; then
  sg=0; sg_note="same ids ($(echo "$ids_cpu" | tr ',' '\n' | wc -l) tokens)"
else
  sg=1; sg_note="ids DIFFER or missing"
fi
note "specgen cuda:0 vs cpu: $sg_note" $sg
grep -E "^--|^device|^prefill|^decode|^rc=|specgen:" "$out/specgen.txt"

san=skipped
cs="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
if [ "${CUDA_CHECK_SANITIZE:-1}" != 0 ] && [ -x "$cs" ]; then
  : > "$out/sanitizers.log"
  sanitize() {  # sanitize LABEL SECONDS TOOL BINARY FILTER
    local step=/tmp/cuda_check_sanitizer_step.log
    echo "== $1 ($3, $5)"
    timeout "$2" "$cs" --tool "$3" --error-exitcode 99 --print-limit 20 \
      "$carry/$4" --gtest_filter="$5" > "$step" 2>&1
    local r=$?
    { echo "===== $1 ($3, $5)"; cat "$step"; echo "===== $1 rc=$r"; } >> "$out/sanitizers.log"
    note "$1 ($3; 0 clean, 99 errors, 124 timed out)" $r
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED)  \]|^\[==========\] [0-9]+ tests" "$step"
  }
  echo "== compute-sanitizer"
  sanitize "memcheck op test" 150 memcheck cuda_backend_test '*'
  sanitize "racecheck op test" 90 racecheck cuda_backend_test \
    '*GatedDeltaRule*:*AttentionLong*:*Argmax*:*MatmulLoadPaths*'
  sanitize "synccheck op test" 40 synccheck cuda_backend_test \
    '*GatedDeltaRule*:*AttentionLong*:*Argmax*'
  sanitize "memcheck model test" 150 memcheck cuda_model_test '*'
  san=done
fi

tar -C "$xml" -czf "$out/xml.tgz" . 2>/dev/null
{
  for s in "${summary[@]}"; do echo "$s"; done
  echo "-- cuda_backend_test"; gtest_counts "$out/cuda_backend_test.log"
  echo "-- cuda_model_test"; gtest_counts "$out/cuda_model_test.log"
  grep "cuda-vs-cpu" "$out/cuda_model_test.log"
  echo "-- specgen"; grep -E "^--|^prefill|^decode" "$out/specgen.txt"
  echo "sanitizers: $san"
  echo "overall: $([ $failed = 0 ] && echo PASS || echo FAIL)"
} | tee "$out/summary.txt"
exit $failed
