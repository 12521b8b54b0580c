#!/usr/bin/env bash
# The CUDA backend's checks on the GPU machine, from binaries built here.
#
#   tools/cuda_check.sh prepare   (on the build machine, with Bazel)
#       Builds //kernels/cuda:cuda_backend_test and :matmul_bench with
#       --config=cuda --config=static (only glibc, libm, libgcc_s and the
#       NVIDIA driver needed at run time; cudart is linked statically) and
#       copies them to .carry/cuda/ (git-ignored).
#
#   tools/cuda_check.sh [run]     (on the GPU machine: no Bazel needed)
#       Runs the carried binaries and writes into $OUT (default
#       /tmp/cuda_check): nvidia-smi.txt, cuda_backend_test.log/.xml,
#       matmul_bench.txt, and unless CUDA_CHECK_SANITIZE=0, compute-sanitizer
#       memcheck/racecheck logs over a quick subset of the tests, then
#       summary.txt. Exit status: that of the op test. The timeouts add up
#       to under 600 s (one device call).
set -uo pipefail
cd "$(dirname "$0")/.."
mode="${1:-run}"
carry=.carry/cuda

if [ "$mode" = prepare ]; then
  bazel build --config=cuda --config=static \
      //kernels/cuda:cuda_backend_test //kernels/cuda:matmul_bench || exit 1
  mkdir -p "$carry"
  for b in cuda_backend_test matmul_bench; do
    rm -f "$carry/$b"
    cp bazel-bin/kernels/cuda/$b "$carry/$b" && chmod u+w,a+x "$carry/$b" || exit 1
  done
  ls -la "$carry"
  exit 0
fi

if [ "$mode" != run ]; then
  echo "usage: $0 [prepare|run]" >&2
  exit 2
fi

out="${OUT:-/tmp/cuda_check}"
mkdir -p "$out"
for b in cuda_backend_test matmul_bench; do
  if [ ! -x "$carry/$b" ]; then
    echo "missing $carry/$b: run '$0 prepare' on the build machine and carry .carry" |
      tee "$out/summary.txt"
    exit 1
  fi
done

{ nvidia-smi; nvidia-smi -q -d CLOCK | head -40; } > "$out/nvidia-smi.txt" 2>&1

echo "== cuda_backend_test"
timeout 280 "$carry/cuda_backend_test" --gtest_output="xml:$out/cuda_backend_test.xml" \
  > "$out/cuda_backend_test.log" 2>&1
test_rc=$?
tail -n 40 "$out/cuda_backend_test.log"

echo "== matmul_bench"
timeout 60 "$carry/matmul_bench" > "$out/matmul_bench.txt" 2>&1
bench_rc=$?
cat "$out/matmul_bench.txt"

san_summary="skipped"
if [ "${CUDA_CHECK_SANITIZE:-1}" != 0 ] && command -v compute-sanitizer > /dev/null; then
  quick='*LoadPaths*:*RmsNorm*:*Conv1d*:*GatedDeltaRule*:*SwigluAndEmbed*:*MemoryOps*:*AttentionLong*:*Rejects*'
  echo "== compute-sanitizer memcheck ($quick)"
  timeout 130 compute-sanitizer --tool memcheck --error-exitcode 99 \
    "$carry/cuda_backend_test" --gtest_filter="$quick" > "$out/memcheck.log" 2>&1
  mc_rc=$?
  tail -n 5 "$out/memcheck.log"
  echo "== compute-sanitizer racecheck (GDN, reductions)"
  timeout 90 compute-sanitizer --tool racecheck --error-exitcode 99 \
    "$carry/cuda_backend_test" --gtest_filter='*GatedDeltaRule*:*AttentionLong*:*Argmax*' \
    > "$out/racecheck.log" 2>&1
  rc_rc=$?
  tail -n 5 "$out/racecheck.log"
  san_summary="memcheck rc=$mc_rc racecheck rc=$rc_rc (0 clean, 99 errors found, 124 timed out)"
fi

{
  echo "cuda_backend_test rc=$test_rc"
  grep -E "^\[==========\]|^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \] [0-9]" \
    "$out/cuda_backend_test.log"
  echo "matmul_bench rc=$bench_rc"
  echo "sanitizers: $san_summary"
} | tee "$out/summary.txt"
exit $test_rc
