#!/usr/bin/env bash
# Builds the libFuzzer targets (tools/fuzz/build.sh, incremental) and runs
# each for a fixed time, one after the other:
#
#   tools/fuzz/run.sh [--seconds N] [--results FILE] [--fresh] [TARGET...]
#
# Per target: first every input in tools/fuzz/crashes/<target>/ is replayed
# once (regression inputs of crashes found before: each must now pass), then,
# whatever the replay gave, libFuzzer runs for N seconds (default 60) from
# the seed corpus tools/fuzz/corpus/<target>/ plus the working corpus in
# $FUZZ_OUT/corpus/<target>/ (what earlier local runs found; --fresh empties
# it first). A crash, sanitizer report, FUZZ_CHECK failure, timeout (an input
# over 10 s) or out-of-memory (2 GB in all, or 512 MB in one allocation)
# stops the target with a non-zero exit code and leaves the input in
# $FUZZ_OUT/artifacts/<target>/.
#
# Prints one line per target: executions/s, coverage (libFuzzer's cov:
# edges and ft: features), the exit code and any finding. --results FILE
# gets "build RC" then "TARGET RC" lines (tools/test turns them into
# checks). Exit status 0 iff the build and every target passed.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/fuzz/targets.sh

seconds=60
results=""
fresh=0
targets=()
while (($#)); do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --seconds=*) seconds=${1#*=}; shift ;;
    --results) results=$2; shift 2 ;;
    --results=*) results=${1#*=}; shift ;;
    --fresh) fresh=1; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "fuzz/run: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
((${#targets[@]})) || targets=("${FUZZ_TARGETS[@]}")
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "fuzz/run: --seconds needs a number" >&2; exit 2; }
[ -n "$results" ] && : >"$results"

OUT=${FUZZ_OUT:-tools/fuzz/out}
build_start=$SECONDS
tools/fuzz/build.sh "${targets[@]}"
build_rc=$?
build_s=$((SECONDS - build_start))
[ -n "$results" ] && echo "build $build_rc" >>"$results"
if [ $build_rc != 0 ]; then
  echo "fuzz/run: build failed (exit $build_rc)"
  exit 1
fi

summary=()
status=0
for t in "${targets[@]}"; do
  bin="$OUT/bin/${t}_fuzzer"
  work="$OUT/corpus/$t"
  artifacts="$OUT/artifacts/$t"
  log="$OUT/logs/$t.log"
  ((fresh)) && rm -rf "$work"
  # Scratch files of the target (model_files' checkpoint directory).
  export TMPDIR="$OUT/tmp/$t"
  rm -rf "$TMPDIR"
  mkdir -p "$work" "$artifacts" "$(dirname "$log")" "$TMPDIR"
  dict=()
  [ -f "tools/fuzz/dict/$t.dict" ] && dict=(-dict="tools/fuzz/dict/$t.dict")
  flags=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=512 -print_final_stats=1
         -artifact_prefix="$artifacts/" "${dict[@]}")

  # Regression inputs: one at a time (libFuzzer stops at the first that
  # fails), each must pass.
  rc=0
  findings=()
  failed=()
  mapfile -t regressions < <(find "tools/fuzz/crashes/$t" -type f 2>/dev/null | sort)
  if ((${#regressions[@]})); then
    echo "=== fuzz $t: replaying ${#regressions[@]} regression inputs"
    : >"$log.regressions"
    for r in "${regressions[@]}"; do
      if ! "$bin" "${flags[@]}" "$r" >>"$log.regressions" 2>&1; then
        failed+=("$(basename "$r")")
      fi
    done
    if ((${#failed[@]})); then
      rc=1
      findings+=("${#failed[@]} of ${#regressions[@]} regression inputs fail (${failed[*]}; $log.regressions)")
      echo "--- failing regression inputs: ${failed[*]}"
      grep -E "FUZZ_CHECK failed|runtime error|^SUMMARY|Check failed" "$log.regressions" | sort | uniq -c
    fi
  fi

  # Fuzzing runs even when a regression input fails: the figures and any new
  # finding are wanted either way.
  echo "=== fuzz $t: ${seconds} s"
  # Backstop for a hang libFuzzer's own timers miss. A fixed seed
  # (SPECSERVE_FUZZ_SEED, default 1) makes a run repeat the last one's inputs
  # from a fresh corpus: a finding reproduces.
  timeout --kill-after=30 $((seconds + 120)) \
    "$bin" "${flags[@]}" -seed="${SPECSERVE_FUZZ_SEED:-1}" \
    -max_total_time="$seconds" \
    "$work" "tools/fuzz/corpus/$t" >"$log" 2>&1
  fuzz_rc=$?
  if [ $fuzz_rc != 0 ]; then
    rc=$fuzz_rc
    art=$(grep -o "Test unit written to [^ ]*" "$log" | tail -1 | sed 's/Test unit written to //')
    reason=$(grep -m1 -E "FUZZ_CHECK failed|runtime error|Check failed|^==[0-9]+==ERROR|^SUMMARY" "$log" | cut -c1-200)
    findings+=("${reason:-exit $fuzz_rc}${art:+; input: $art}")
    echo "--- last lines of $log:"
    tail -40 "$log"
  fi

  eps=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" 2>/dev/null | grep -o '[0-9]*$' | tail -1)
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" 2>/dev/null | grep -o '[0-9]*$' | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" 2>/dev/null | tail -1 | grep -o '[0-9]*')
  ft=$(grep -o 'ft: [0-9]*' "$log" 2>/dev/null | tail -1 | grep -o '[0-9]*')
  corp=$(grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' "$log" 2>/dev/null | tail -1 | sed 's/corp: //')
  line=$(printf '%-20s exec/s %-7s runs %-9s cov %-6s ft %-7s corpus %-12s exit %s' \
    "$t" "${eps:--}" "${runs:--}" "${cov:--}" "${ft:--}" "${corp:--}" "$rc")
  for f in "${findings[@]}"; do line+=$'\n    FINDING: '"$f"; done
  summary+=("$line")
  [ -n "$results" ] && echo "$t $rc" >>"$results"
  [ $rc = 0 ] || status=1
done

echo "=== fuzz summary (build ${build_s} s, ${seconds} s per target; logs in $OUT/logs)"
printf '%s\n' "${summary[@]}"
exit $status
