#!/bin/bash
# specgen's output contract: an `ids:` line with the generated ids, tokens/s
# lines, the greedy continuation of every fixture prompt equal to HF's, and
# --dump-logits writing one row of vocab-size floats per prompt position.
set -euo pipefail
SPECGEN="$(pwd)/$1"
cd "${TEST_SRCDIR}/${TEST_WORKSPACE}"

out=$("$SPECGEN" --model tests/models/tiny_a --prompt-ids 5,17,42 --max-new 8)
echo "$out"
echo "$out" | grep -Eq '^ids: [0-9]+(,[0-9]+){7}$'
echo "$out" | grep -q '^prefill: .*tokens/s$'
echo "$out" | grep -q '^decode: .*tokens/s$'

# Every fixture prompt: specgen's ids == HF's greedy (the fixture models have
# no near-ties in their greedy runs; hf_parity_test handles those in general).
for fixture in tests/fixtures/*.json; do
  /usr/bin/python3 - "$fixture" <<'PY' > "${TEST_TMPDIR}/cases"
import json, sys
f = json.load(open(sys.argv[1]))
for p in f["prompts"]:
    if min(p["greedy_margin"]) > 1e-3:
        print(f["model"], ",".join(map(str, p["ids"])), ",".join(map(str, p["greedy"])))
PY
  while read -r model ids greedy; do
    n=$(echo "$greedy" | tr ',' '\n' | wc -l)
    got=$("$SPECGEN" --model "$model" --prompt-ids "$ids" --max-new "$n" | sed -n 's/^ids: //p')
    if [ "$got" != "$greedy" ]; then
      echo "FAIL $fixture prompt $ids: specgen $got, HF $greedy"
      exit 1
    fi
  done < "${TEST_TMPDIR}/cases"
  echo "ok $fixture ($(wc -l < "${TEST_TMPDIR}/cases") prompts)"
done

# --device: cpu is the default; a bad name is rejected; cuda:0 either runs
# (a CUDA build on a GPU machine: same greedy ids as the CPU) or fails with
# an error that names the problem (no CUDA in this build, or no GPU).
cpu_ids=$("$SPECGEN" --model tests/models/tiny_a --prompt-ids 5,17,42 --max-new 8 --device cpu | sed -n 's/^ids: //p')
[ "$cpu_ids" = "$(echo "$out" | sed -n 's/^ids: //p')" ]
if "$SPECGEN" --model tests/models/tiny_a --prompt-ids 5 --max-new 1 --device gpu 2> "${TEST_TMPDIR}/err"; then
  echo "FAIL: --device gpu accepted"; exit 1
fi
grep -q "expected cpu or cuda:N" "${TEST_TMPDIR}/err"
if gpu_out=$("$SPECGEN" --model tests/models/tiny_a --prompt-ids 5,17,42 --max-new 8 --device cuda:0 2> "${TEST_TMPDIR}/err"); then
  [ "$(echo "$gpu_out" | sed -n 's/^ids: //p')" = "$cpu_ids" ] || { echo "FAIL: cuda:0 ids differ"; exit 1; }
  echo "ok --device cuda:0 (same ids as cpu)"
else
  cat "${TEST_TMPDIR}/err"
  grep -Eq "built without CUDA|no device 0" "${TEST_TMPDIR}/err"
  echo "ok --device cuda:0 fails cleanly here"
fi

tmp="${TEST_TMPDIR}/logits.json"
"$SPECGEN" --model tests/models/tiny_a --prompt-ids 5,17,42 --max-new 0 --dump-logits "$tmp" > /dev/null
/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["logits"]
assert len(rows) == 3 and all(len(r) == 317 for r in rows), [len(r) for r in rows]
PY
echo PASS
