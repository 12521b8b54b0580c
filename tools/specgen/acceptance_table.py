#!/usr/bin/env python3
"""Acceptance of the MTP draft on the default model: mean tokens per round for
draft depths k = 1..4 over a set of Python prompts (held-out style: ordinary
library code, not taken from the training files), greedy, 128 new tokens
each, through specgen's speculative engine. Every greedy run is also checked
token-for-token against plain greedy (--compare-plain). --temperature T
samples instead (the spec == plain column is then n/a).

    bazel build -c opt //tools/specgen
    tools/specgen/acceptance_table.py [--specgen bazel-bin/tools/specgen/specgen]
        [--model models/default] [--max-new 128] [--ks 1,2,3,4]

Prints one row per prompt and k, then the pooled figures per k:
tokens/round = 1 + sum(accepted) / sum(rounds) (the bonus included),
drafts/round = sum(accepted) / sum(rounds), and the acceptance rate at each
draft position. Exit status 1 if any run differs from plain greedy.
"""
import argparse
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

PROMPTS = [
    ("argparse", 'import argparse\nimport json\n\n\ndef parse_args():\n'
                 '    parser = argparse.ArgumentParser(description="Convert a'
                 ' CSV file to JSON.")\n'),
    ("lru_cache", 'class LRUCache:\n    """A least-recently-used cache with a'
                  ' fixed capacity."""\n\n    def __init__(self, capacity):\n'),
    ("read_config", 'def read_config(path):\n    """Return the settings in'
                    ' the INI file at path as a dict."""\n'
                    '    with open(path) as f:\n'),
    ("unittest", 'import unittest\n\n\nclass TestSort(unittest.TestCase):\n'
                 '    def test_empty_list(self):\n'),
    ("merge_sort", 'def merge_sort(items):\n    if len(items) <= 1:\n'
                   '        return items\n    middle = len(items) // 2\n'),
    ("walk_files", 'import os\n\n\ndef walk_files(root, suffix=".py"):\n'
                   '    """Yield every file under root whose name ends with'
                   ' suffix."""\n'),
    ("property", 'class Person:\n    def __init__(self, name, age):\n'
                 '        self._name = name\n        self._age = age\n\n'
                 '    @property\n    def name(self):\n'),
]


def run(specgen, model, prompt, k, max_new, temperature, seed):
    out = subprocess.run(
        [specgen, "--model", model, "--prompt", prompt, "--max-new",
         str(max_new), "--spec-k", str(k), "--compare-plain", "--threads", "1",
         "--temperature", str(temperature), "--seed", str(seed)],
        check=True, capture_output=True, text=True, cwd=REPO).stdout
    fields = dict(l.split(": ", 1) for l in out.splitlines() if ": " in l)
    return {
        "tokens": len(fields["ids"].split(",")) if fields["ids"] else 0,
        "rounds": int(fields["rounds"]),
        "accepted": int(fields["accepted"]),
        "rates": [float(x) for x in fields["accept_rate_per_position"].split(",")],
        # Sampled runs equal plain sampling in distribution only: n/a.
        "equal": {"true": True, "false": False}.get(
            fields["plain_equal"].split()[0]),
        "tps": float(fields["decode"].split("=")[1].split()[0]),
    }


def yes_no(equal):
    return "n/a" if equal is None else ("yes" if equal else "NO")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--specgen", default="bazel-bin/tools/specgen/specgen")
    ap.add_argument("--model", default="models/default")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--ks", default="1,2,3,4")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="0 = greedy (the reported figures); > 0 samples")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    ks = [int(k) for k in a.ks.split(",")]
    pooled = {k: {"rounds": 0, "accepted": 0, "drafted_pos": [0] * k,
                  "accepted_pos": [0.0] * k, "equal": True, "tokens": 0}
              for k in ks}
    print("%-12s %2s %6s %6s %12s %12s %6s" % (
        "prompt", "k", "tokens", "rounds", "tokens/round", "drafts/round",
        "plain="))
    for name, prompt in PROMPTS:
        for k in ks:
            r = run(a.specgen, a.model, prompt, k, a.max_new, a.temperature,
                    a.seed)
            p = pooled[k]
            p["rounds"] += r["rounds"]
            p["accepted"] += r["accepted"]
            p["tokens"] += r["tokens"]
            if r["equal"] is not None:
                p["equal"] = p["equal"] and r["equal"]
            else:
                p["equal"] = None
            for i, rate in enumerate(r["rates"]):
                # Each round drafts at every position (k never shrinks here:
                # the capacity has room).
                p["drafted_pos"][i] += r["rounds"]
                p["accepted_pos"][i] += rate * r["rounds"]
            print("%-12s %2d %6d %6d %12.3f %12.3f %6s" % (
                name, k, r["tokens"], r["rounds"],
                1 + r["accepted"] / r["rounds"], r["accepted"] / r["rounds"],
                yes_no(r["equal"])))
    print()
    print("pooled over %d prompts, %d new tokens each (%s):" % (
        len(PROMPTS), a.max_new,
        "greedy" if a.temperature == 0 else
        "sampled, temperature %g, seed %d" % (a.temperature, a.seed)))
    print("| k | tokens/round (incl. bonus) | accepted drafts/round |"
          " acceptance by draft position | spec == plain greedy |")
    print("|---|---|---|---|---|")
    ok = True
    for k in ks:
        p = pooled[k]
        rates = ", ".join("%.3f" % (acc / d if d else 0.0) for acc, d in
                          zip(p["accepted_pos"], p["drafted_pos"]))
        print("| %d | %.3f | %.3f | %s | %s |" % (
            k, 1 + p["accepted"] / p["rounds"], p["accepted"] / p["rounds"],
            rates, yes_no(p["equal"])))
        ok &= p["equal"] is not False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
