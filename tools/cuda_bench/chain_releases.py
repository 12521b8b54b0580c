#!/usr/bin/env python3
"""What holds out_proj and o_proj after the chains between matmuls, from
`cuda_bench --trace_dump=FILE` (the boundary trace's raw records).

A [5120][6144] call (out_proj after a linear layer's in_proj, o_proj after a
full layer's q|k|v) waits for the chain between the two matmuls: the fused
conv + delta rule + norm, or AttentionInputs + attention + combine. Per
layer type this prints, in us after the previous matmul's last block ended
(means over the step's layers): its blocks' start (min, median, max), the
median block's ring loads issued, its release from the wait (min, median,
max), and its median and last block's end.

Usage: chain_releases.py TRACE.bin [--out 5120 --in 6144]
"""
import argparse
import sys

import numpy as np

import boundary_tails


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--out", type=int, default=5120)
    ap.add_argument("--in", dest="inn", type=int, default=6144)
    args = ap.parse_args()
    launches = boundary_tails.load(args.trace)
    rows = {}
    for prev, cur in zip(launches, launches[1:]):
        if cur["out"] != args.out or cur["in"] != args.inn:
            continue
        t0 = prev["t"][:, 3].max()  # the previous matmul's last block end
        t = cur["t"] - t0
        kind = f"after [{prev['out']}][{prev['in']}]"
        rows.setdefault(kind, []).append([
            t[:, 0].min(), np.median(t[:, 0]), t[:, 0].max(), np.median(t[:, 5]),
            t[:, 1].min(), np.median(t[:, 1]), t[:, 1].max(), np.median(t[:, 3]), t[:, 3].max()])
    cols = ["start_min", "start_med", "start_max", "issued", "rel_min", "rel_med", "rel_max",
            "end_med", "end_max"]
    print(f"{'':24} {'calls':>5} " + " ".join(f"{c:>9}" for c in cols))
    for kind, r in rows.items():
        m = np.mean(np.array(r), axis=0)
        print(f"{kind:24} {len(r):5d} " + " ".join(f"{v:9.1f}" for v in m))
    return 0


if __name__ == "__main__":
    sys.exit(main())
