#!/bin/bash
# specgen's output contract: an `ids:` line with the generated ids, tokens/s
# lines, the greedy continuation of every fixture prompt equal to HF's, and
# --dump-logits writing one row of vocab-size floats per prompt position.
# The engine path on the default model: speculative greedy == plain greedy
# for k = 1..4 (checked by --compare-plain and against the plain path's ids),
# acceptance lines, sampled runs reproducible per seed, --prompt text, EOS
# stop / --ignore-eos, multi-turn --script with rewinds.
set -euo pipefail
# (grep -q reads here-strings: fed by a pipe, it exits at the first match and
# the writer dies of SIGPIPE, which pipefail turns into a failed check)
SPECGEN="$(pwd)/$1"
cd "${TEST_SRCDIR}/${TEST_WORKSPACE}"

out=$("$SPECGEN" --model tests/models/tiny_a --prompt-ids 5,17,42 --max-new 8)
echo "$out"
grep -Eq '^ids: [0-9]+(,[0-9]+){7}$' <<< "$out"
grep -q '^prefill: .*tokens/s$' <<< "$out"
grep -q '^decode: .*tokens/s$' <<< "$out"

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
# ---- the engine path on the default model (it has an MTP head);
# models/default links here; runfiles hold the target (//models:all).
M=models/specserve-tiny-py
ids_of() { sed -n 's/^ids: //p'; }
field() { sed -n "s/^$1: //p"; }
prompts=($'def fibonacci(n):\n' $'import os\nimport sys\n\n'
         $'class Stack:\n    def __init__(self):\n')
for p in "${prompts[@]}"; do
  plain=$("$SPECGEN" --model $M --prompt "$p" --max-new 40)
  grep -Eq '^prompt_ids: [0-9]+(,[0-9]+)*$' <<< "$plain"
  grep -Eq '^text: ".*"$' <<< "$plain"
  plain_ids=$(echo "$plain" | ids_of)
  # --prompt TEXT == --prompt-ids of its tokens.
  by_ids=$("$SPECGEN" --model $M --prompt-ids "$(echo "$plain" | field prompt_ids)" --max-new 40 | ids_of)
  [ "$by_ids" = "$plain_ids" ] || { echo "FAIL --prompt vs --prompt-ids"; exit 1; }
  for k in 1 2 3 4; do
    out=$("$SPECGEN" --model $M --prompt "$p" --max-new 40 --spec-k $k --burst 13 --compare-plain)
    grep -qx 'plain_equal: true' <<< "$out" || { echo "$out"; echo "FAIL k=$k: spec != plain"; exit 1; }
    [ "$(echo "$out" | ids_of)" = "$plain_ids" ] || { echo "FAIL k=$k ids"; exit 1; }
    grep -Eq '^rounds: [1-9][0-9]*$' <<< "$out"
    grep -Eq '^mean_accepted_per_round: [0-9]+\.[0-9]+$' <<< "$out"
    grep -Eq '^mean_accepted_drafts_per_round: [0-9]+\.[0-9]+$' <<< "$out"
    grep -Eq "^accept_rate_per_position: [01]\.[0-9]+(,[01]\.[0-9]+){$((k - 1))}\$" <<< "$out"
    grep -q '^decode: .*tokens/s$' <<< "$out"
    # tokens per round = 1 + accepted drafts per round.
    /usr/bin/python3 -c '
import sys
f = dict(l.split(": ", 1) for l in sys.argv[1].splitlines() if ": " in l)
t, d = float(f["mean_accepted_per_round"]), float(f["mean_accepted_drafts_per_round"])
assert abs(t - 1 - d) < 2e-3 and 1 <= t <= 1 + int(sys.argv[2]), (t, d)' "$out" $k
  done
done
echo "ok spec == plain greedy, k=1..4"

# Plain decode through the engine (k=0) agrees too.
grep -qx 'plain_equal: true' <<< "$("$SPECGEN" --model $M --prompt-ids 5,17,42 --max-new 20 --compare-plain)"

# EOS: this prompt's greedy continuation starts with <|endoftext|> (6141).
eos=$'if __name__ == "__main__":\n    main()\n'
[ "$("$SPECGEN" --model $M --prompt "$eos" --max-new 8 | ids_of)" = 6141 ]
out=$("$SPECGEN" --model $M --prompt "$eos" --max-new 8 --spec-k 3)
[ "$(echo "$out" | ids_of)" = 6141 ] && grep -qx 'end: stop_token' <<< "$out"
[ "$("$SPECGEN" --model $M --prompt "$eos" --max-new 8 --spec-k 3 --ignore-eos | ids_of | tr ',' '\n' | wc -l)" = 8 ]
echo "ok EOS stop and --ignore-eos"

# Sampled: the same seed gives the same ids (plain and speculative).
for k in 0 2; do
  a=$("$SPECGEN" --model $M --prompt 'class Foo:' --max-new 24 --spec-k $k --temperature 0.8 --top-p 0.95 --top-k 50 --seed 7 | ids_of)
  b=$("$SPECGEN" --model $M --prompt 'class Foo:' --max-new 24 --spec-k $k --temperature 0.8 --top-p 0.95 --top-k 50 --seed 7 | ids_of)
  [ -n "$a" ] && [ "$a" = "$b" ] || { echo "FAIL sampled k=$k not reproducible"; exit 1; }
done
if "$SPECGEN" --model $M --prompt x --temperature -1 2> "${TEST_TMPDIR}/err"; then
  echo "FAIL: negative temperature accepted"; exit 1
fi
grep -q temperature "${TEST_TMPDIR}/err"
echo "ok sampled"

# Multi-turn script on one session: text and id prompts, rewinds, a
# continuation; every turn equals plain greedy on the same history.
script="${TEST_TMPDIR}/script.json"
cat > "$script" <<'JSON'
[{"prompt": "def add(a, b):\n", "max_new": 20},
 {"prompt": "\n\ndef sub(a, b):\n", "max_new": 20},
 {"rewind": true, "max_new": 12},
 {"prompt_ids": [198, 198], "max_new": 10, "rewind": true},
 {"max_new": 9}]
JSON
for k in 0 3; do
  out=$("$SPECGEN" --model $M --script "$script" --spec-k $k --burst 5 --compare-plain)
  grep -qx 'plain_equal: true' <<< "$out" || { echo "$out"; echo "FAIL script k=$k"; exit 1; }
  [ "$(echo "$out" | grep -c '^turn [0-9] ids: ')" = 5 ]
  [ "$(echo "$out" | grep -c '^turn [0-9] text: "')" = 5 ]
done
# Turn 3 (rewind, no new input) regenerates turn 2's reply from its prompt.
t2=$(echo "$out" | field 'turn 2 ids'); t3=$(echo "$out" | field 'turn 3 ids')
[ "${t2:0:${#t3}}" = "$t3" ] || { echo "FAIL rewind: $t2 / $t3"; exit 1; }
echo '[{"promt": "x"}]' > "${TEST_TMPDIR}/bad.json"
if "$SPECGEN" --model $M --script "${TEST_TMPDIR}/bad.json" 2> "${TEST_TMPDIR}/err"; then
  echo "FAIL: bad script accepted"; exit 1
fi
grep -q 'unknown key "promt"' "${TEST_TMPDIR}/err"
echo "ok --script"
echo PASS
