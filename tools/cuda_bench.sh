#!/usr/bin/env bash
# Build, check and time the CUDA backend in one GPU-machine call.
#
#   tools/cuda_bench.sh prepare   (build machine, with Bazel)
#       tools/cuda_check.sh prepare, plus //tools/cuda_bench (same flags and
#       output base: --config=cuda --config=static), all into .carry/cuda/.
#
#   tools/cuda_bench.sh [run]     (GPU machine, repository root; no Bazel)
#       1. checks: the op test (CPU vs CUDA, bit-exact row invariance), the
#          model test (verify == decode bit-exact, CUDA vs CPU), specgen
#          cuda:0 vs cpu greedy ids, compute-sanitizer memcheck on the
#          matmul/embed op tests (CUDA_BENCH_SANITIZE=0 skips it);
#       2. cuda_bench: copy bandwidth, matmul sweep, the random-weight
#          Qwen3.5-27B-shape model ((a) decode, (b) verify 2..8, (c)
#          DecodeBatch 1..64) and models/default decode, each beside its
#          floor (weight bytes / copy bandwidth of the same run).
#       Writes into $OUT (default /tmp/cuda_bench): checks.log,
#       cuda_bench.txt, cuda_bench.json, summary.txt. Exit 0 only if all
#       passed.
set -uo pipefail
cd "$(dirname "$0")/.."
mode="${1:-run}"
carry=.carry/cuda

if [ "$mode" = prepare ]; then
  tools/cuda_check.sh prepare || exit 1
  ob="${CUDA_CHECK_OUTPUT_BASE:-$HOME/.cache/bazel_cuda/ob}"
  flags=(--config=cuda --config=static)
  bazel --output_base="$ob" build "${flags[@]}" --symlink_prefix=/ //tools/cuda_bench || exit 1
  bin="$(bazel --output_base="$ob" info "${flags[@]}" bazel-bin 2>/dev/null)" || exit 1
  rm -f "$carry/cuda_bench"
  cp "$bin/tools/cuda_bench/cuda_bench" "$carry/cuda_bench" && chmod u+w,a+x "$carry/cuda_bench"
  du -sh "$carry"
  exit 0
fi
[ "$mode" = run ] || { echo "usage: $0 [prepare|run]" >&2; exit 2; }

out="${OUT:-/tmp/cuda_bench}"
mkdir -p "$out"
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
prompt=1,324,313,2765,5811,7,2365,11,1871,323,258,744,269,1479,1
for dev in cuda:0 cpu; do
  timeout 30 "$carry/specgen" --model models/default --prompt-ids "$prompt" --max-new 128 \
    --ignore-eos --device "$dev" > "/tmp/cb_sg_${dev%%:*}.txt" 2>&1
done
g=$(sed -n 's/^ids: //p' /tmp/cb_sg_cuda.txt); c=$(sed -n 's/^ids: //p' /tmp/cb_sg_cpu.txt)
{ echo "== specgen cuda:0 vs cpu"; grep -E "^prefill|^decode" /tmp/cb_sg_cuda.txt; } >> "$out/checks.log"
if [ -n "$g" ] && [ "$g" = "$c" ]; then note "specgen ids cuda == cpu" 0; else note "specgen ids cuda == cpu" 1; fi
cs="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
if [ "${CUDA_BENCH_SANITIZE:-1}" != 0 ] && [ -x "$cs" ]; then
  timeout 90 "$cs" --tool memcheck --error-exitcode 99 --print-limit 10 "$carry/cuda_backend_test" \
    --gtest_filter='*Matmul*:*SwigluAndEmbed*' > /tmp/cb_san.log 2>&1; rc=$?
  { echo "== memcheck matmul/embed"; grep -E "ERROR SUMMARY|Invalid|^\[  (PASSED|FAILED)" /tmp/cb_san.log | head; } >> "$out/checks.log"
  note "memcheck matmul/embed" $rc
fi
cat "$out/checks.log"

echo "== cuda_bench"
timeout "${CUDA_BENCH_TIMEOUT:-240}" "$carry/cuda_bench" --json="$out/cuda_bench.json" \
  --default_model=models/default ${CUDA_BENCH_ARGS:-} 2>&1 | tee "$out/cuda_bench.txt"
rc=${PIPESTATUS[0]}; note cuda_bench $rc
{
  for s in "${summary[@]}"; do echo "$s"; done
  echo "overall: $([ $failed = 0 ] && echo PASS || echo FAIL)"
} | tee "$out/summary.txt"
exit $failed
