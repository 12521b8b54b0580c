#!/usr/bin/env python3
"""Compares two cuda_bench builds run alternately on one machine
(tools/cuda_bench.sh ab): the median of each build's rounds for the 27B-shape
model's figures, the ratio new / base, and the floor of the same runs.

Usage: ab_compare.py BASE_NAME NEW_NAME OUT_JSON base_1.json new_1.json ...
(files named <build>_<round>.json; the build is BASE_NAME or NEW_NAME).
Prints a table; writes OUT_JSON."""
import json
import os
import statistics
import sys


def figures(d):
    """{name: value} of one cuda_bench JSON (its model_27b section)."""
    m = d["model_27b"]
    out = {"floor_ms (weight bytes / copy)": m["floor_ms"],
           "(a) decode ms, with logits": m["decode_ms"],
           "(a) decode ms, greedy": m["decode_greedy_ms"]}
    for v in m.get("verify", []):
        if v["columns"] in (2, 4, 8):
            out[f"(b) verify {v['columns']} cols, greedy ms"] = v["greedy_ms"]
            out[f"(b) verify {v['columns']} cols / greedy decode"] = v["x_greedy_decode"]
    for b in m.get("decode_batch", []):
        if b["B"] in (1, 8, 64):
            out[f"(c) B={b['B']} greedy ms"] = b["greedy_ms"]
        if b["B"] == 64:
            out["(c) B=64 / B=1, greedy"] = b["greedy_x_b1"]
    return out


def main(argv):
    base, new, out_json, files = argv[1], argv[2], argv[3], argv[4:]
    runs = {base: [], new: []}
    for f in files:
        build = os.path.basename(f).rsplit("_", 1)[0]
        with open(f) as fh:
            runs[build].append(figures(json.load(fh)))
    if not runs[base] or not runs[new]:
        print(f"ab_compare: no runs of {base} or of {new}", file=sys.stderr)
        return 1
    names = [k for k in runs[base][0] if all(k in r for r in runs[base] + runs[new])]
    rows = []
    print(f"{'figure':42s} {base:>14s} {new:>14s} {'new/base':>9s}")
    for k in names:
        b = statistics.median(r[k] for r in runs[base])
        n = statistics.median(r[k] for r in runs[new])
        print(f"{k:42s} {b:14.3f} {n:14.3f} {n / b:9.3f}")
        rows.append({"figure": k, base: b, new: n, "new_over_base": n / b})
    print(f"(medians of {len(runs[base])} / {len(runs[new])} rounds, run alternately on one "
          "machine)")
    with open(out_json, "w") as fh:
        json.dump({"base": base, "new": new, "rounds": [len(runs[base]), len(runs[new])],
                   "figures": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
