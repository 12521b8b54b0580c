#!/usr/bin/env python3
"""Where a matmul call's tail comes from, from `cuda_bench --trace_dump=FILE`.

The dump holds, per tensor-core matmul launch of one greedy step, int64 in,
out, tokens, grid, then grid x 6 uint64 stamps per block (the global timer in
ns, the SM id in the top byte): start, released from the wait, ready (after
the fused norm), end, the last unit's multiplications done, and the ring's
first weight loads issued (kernels/cuda/matmul_mma.h).

For each shape this prints, over its launches, the blocks grouped by what
their part holds (kernels/cuda/matmul_mma.cu: PartBegin; a part is one block's
contiguous range of (tile, 64-k step) pairs): `owner` parts end with piece 0 of
a split tile, whose block waits for the tile's other pieces and sums them;
`tailpiece` parts end inside a tile; `whole` parts end with a whole tile.
Times are us from the launch's median `ready`: when the multiplications end
(mma) and how long the end takes after them (epi: piece writes, waits, sums).
Then how much of the blocks' spread in rate is the SM's (the same SM slow in
every launch) and how much is the launch's.

Usage: boundary_tails.py TRACE.bin [--parts 264]
"""
import argparse
import struct
import sys

import numpy as np

STAMPS = 6
TIME_MASK = (1 << 56) - 1


def load(path):
    data = open(path, "rb").read()
    off, launches = 0, []
    while off < len(data):
        inn, out, tokens, grid = struct.unpack_from("<4q", data, off)
        off += 32
        raw = np.frombuffer(data, dtype=np.uint64, count=grid * STAMPS, offset=off)
        raw = raw.reshape(grid, STAMPS)
        off += 8 * grid * STAMPS
        launches.append({
            "in": inn, "out": out, "tokens": tokens, "grid": grid,
            "t": (raw & np.uint64(TIME_MASK)).astype(np.float64) / 1e3,  # us
            "sm": (raw[:, 0] >> np.uint64(56)).astype(int),
        })
    return launches


def parts_of(inn, out, parts):
    """Each part's units (tile, first step in the tile, steps), as the kernel cuts them."""
    tiles, tile_steps = -(-out // 128), -(-inn // 64)
    steps = tiles * tile_steps
    parts = min(parts, steps)
    result = []
    for v in range(parts):
        s, end, units = v * steps // parts, (v + 1) * steps // parts, []
        while s < end:
            tile = s // tile_steps
            e = min(end, (tile + 1) * tile_steps)
            units.append((tile, s - tile * tile_steps, e - s))
            s = e
        result.append(units)
    return result, tile_steps


def kind(units, tile_steps):
    _, first, n = units[-1]
    if first == 0 and n == tile_steps:
        return "whole"
    return "owner" if first == 0 else "tailpiece"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--parts", type=int, default=264)
    args = ap.parse_args()
    launches = load(args.trace)
    shapes = {}
    for launch in launches:
        if launch["tokens"] == 1:
            shapes.setdefault((launch["out"], launch["in"]), []).append(launch)
    for (out, inn), group in sorted(shapes.items()):
        parts, tile_steps = parts_of(inn, out, args.parts)
        if len(parts) != group[0]["grid"]:
            print(f"[{out}][{inn}]: grid {group[0]['grid']} != {len(parts)} parts; skipped")
            continue
        steps = np.array([sum(u[2] for u in p) for p in parts])
        kinds = {}
        for b, p in enumerate(parts):
            kinds.setdefault(f"{kind(p, tile_steps)}, {len(p)} unit(s)", []).append(b)
        tails = [np.max(l["t"][:, 3]) - np.median(l["t"][:, 3]) for l in group]
        print(f"[{out}][{inn}]: {len(group)} launches, tile of {tile_steps} steps; "
              f"tail (last end - median end) {np.mean(tails):.2f} us")
        print(f"  {'blocks':24s} {'n':>4s} {'steps':>6s} {'mma med':>8s} {'mma max':>8s} "
              f"{'epi med':>8s} {'epi max':>8s} {'end max':>8s}")
        for name, blocks in sorted(kinds.items()):
            b = np.array(blocks)
            mma = np.concatenate([l["t"][b, 4] - np.median(l["t"][:, 2]) for l in group])
            epi = np.concatenate([l["t"][b, 3] - l["t"][b, 4] for l in group])
            end = np.concatenate([l["t"][b, 3] - np.median(l["t"][:, 2]) for l in group])
            print(f"  {name:24s} {len(b):4d} {steps[b].mean():6.1f} {np.median(mma):8.2f} "
                  f"{np.max(mma):8.2f} {np.median(epi):8.2f} {np.max(epi):8.2f} "
                  f"{np.max(end):8.2f}")
        # Rate spread of one-unit parts: the SM's share against the launch's.
        one = np.array([b for b, p in enumerate(parts) if len(p) == 1])
        if len(one) == 0 or len(group) < 4:
            continue
        rel, per_sm = [], {}
        for launch in group:
            rate = steps[one] / (launch["t"][one, 4] - launch["t"][one, 2])
            r = rate / np.median(rate)
            for block, value in zip(one, r):
                rel.append((launch["sm"][block], value))
                per_sm.setdefault(launch["sm"][block], []).append(value)
        sm_mean = {sm: np.mean(v) for sm, v in per_sm.items()}
        values = np.array([v for _, v in rel])
        residual = np.array([v - sm_mean[sm] + 1 for sm, v in rel])
        print(f"  one-unit blocks' rate / launch median: std {values.std():.3f}, "
              f"{residual.std():.3f} with each SM's mean taken out; slowest 1% "
              f"{np.percentile(values, 1):.3f}; SM means "
              f"{min(sm_mean.values()):.3f}..{max(sm_mean.values()):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
