#!/usr/bin/env python3
"""Greedy agreement of bf16-KV decode with fp32-KV decode.

For each prompt, specgen generates MAX_NEW greedy tokens (ignore_eos) twice on
one device, once with --kv_cache_dtype=fp32 and once with bf16, and the two id
lists are compared: the length of the common prefix (tokens before the first
difference) and the fraction of positions whose ids are equal. Once two runs
differ they continue from different histories, so the common prefix is the
figure that measures the cache type; the equal fraction is context.

  tools/cuda_bench/kv_dtype_agreement.py --specgen BIN --model DIR \\
      [--device cuda:0] [--max-new 128] [--out DIR]

Writes kv_dtype_agreement.{txt,json} into --out and exits 0 (the figure is
reported, not judged: bf16 rounding may legitimately flip a near-tie).
"""
import argparse
import json
import os
import subprocess
import sys

# Prompts of different kinds (prose, code, lists, a question, a long one) so
# the agreement is not one context's accident.
PROMPTS = [
    "The history of the printing press begins",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Here is a list of the planets of the solar system in order:",
    "Q: Why is the sky blue?\nA:",
    "Once upon a time, in a small village at the edge of a great forest, "
    "there lived an old clockmaker who",
    "SELECT name, COUNT(*) FROM orders JOIN customers ON",
    "1, 1, 2, 3, 5, 8, 13,",
    "Dear committee, I am writing to apply for the position of",
]


def generate(specgen, model, device, kv, prompt, max_new):
    cmd = [specgen, f"--model={model}", f"--device={device}",
           f"--kv_cache_dtype={kv}", f"--max_new={max_new}", "--ignore_eos",
           f"--prompt={prompt}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-2000:]}")
    for line in r.stdout.splitlines():
        if line.startswith("ids: "):
            return [int(x) for x in line[5:].split(",") if x]
    raise RuntimeError(f"no ids line in specgen output: {r.stdout[-2000:]}")


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--specgen", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/cuda_bench"))
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for prompt in PROMPTS:
        a = generate(args.specgen, args.model, args.device, "fp32", prompt, args.max_new)
        b = generate(args.specgen, args.model, args.device, "bf16", prompt, args.max_new)
        n = min(len(a), len(b))
        common = next((i for i in range(n) if a[i] != b[i]), n)
        equal = sum(1 for i in range(n) if a[i] == b[i])
        rows.append({"prompt": prompt, "tokens": n, "common_prefix": common,
                     "equal_fraction": equal / n if n else 1.0})
    identical = sum(1 for r in rows if r["common_prefix"] == r["tokens"])
    lines = [f"bf16-KV vs fp32-KV greedy decode, {args.device}, {args.model}, "
             f"{args.max_new} tokens per prompt",
             f"{'common prefix':>14} {'equal':>7}  prompt"]
    for r in rows:
        lines.append(f"{r['common_prefix']:>9}/{r['tokens']:<4} {r['equal_fraction']:>7.3f}  "
                     f"{r['prompt'][:50]!r}")
    lines.append(f"identical over all {args.max_new} tokens: {identical} of {len(rows)} prompts")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "kv_dtype_agreement.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "kv_dtype_agreement.json"), "w") as f:
        json.dump({"device": args.device, "model": args.model, "max_new": args.max_new,
                   "identical_prompts": identical, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
