#!/usr/bin/env python3
"""Compares cuda_bench builds run in turn on one machine (tools/cuda_bench.sh
ab): the median of each build's rounds for the 27B-shape model's figures, each
new build's ratio to the base, and the floor of the same runs.

Usage: ab_compare.py BASE_NAME NEW_NAME[,NEW_NAME2...] OUT_JSON base_1.json
new_1.json ... (files named <build>_<round>.json). Prints a table; writes
OUT_JSON."""
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
    base, news, out_json, files = argv[1], argv[2].split(","), argv[3], argv[4:]
    builds = [base] + news
    runs = {b: [] for b in builds}
    for f in files:
        build = os.path.basename(f).rsplit("_", 1)[0]
        with open(f) as fh:
            runs[build].append(figures(json.load(fh)))
    missing = [b for b in builds if not runs[b]]
    if missing:
        print(f"ab_compare: no runs of {', '.join(missing)}", file=sys.stderr)
        return 1
    everyone = [r for b in builds for r in runs[b]]
    names = [k for k in runs[base][0] if all(k in r for r in everyone)]
    rows = []
    head = f"{'figure':42s} {base:>14s}"
    for n in news:
        head += f" {n:>14s} {'/base':>7s}"
    print(head)
    for k in names:
        med = {b: statistics.median(r[k] for r in runs[b]) for b in builds}
        line = f"{k:42s} {med[base]:14.3f}"
        row = {"figure": k, base: med[base]}
        for n in news:
            line += f" {med[n]:14.3f} {med[n] / med[base]:7.3f}"
            row[n] = med[n]
            row[f"{n}_over_base"] = med[n] / med[base]
        if len(news) == 1:
            row["new_over_base"] = med[news[0]] / med[base]
        print(line)
        rows.append(row)
    print(f"(medians of {' / '.join(str(len(runs[b])) for b in builds)} rounds, run in turn "
          "on one machine)")
    with open(out_json, "w") as fh:
        json.dump({"base": base, "new": news[0] if len(news) == 1 else news,
                   "rounds": [len(runs[b]) for b in builds], "figures": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
