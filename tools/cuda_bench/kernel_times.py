#!/usr/bin/env python3
"""Sums ncu's per-kernel durations by kernel name and grid (ncu --csv --metrics
gpu__time_duration.sum output on stdin): name, launches, total us, mean us."""
import collections
import csv
import sys

rows = [r for r in csv.reader(sys.stdin) if len(r) > 10]
head = rows[0]
name_i, metric_i, value_i = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
unit_i = head.index("Metric Unit")
grid_i = head.index("Grid Size") if "Grid Size" in head else None
total = collections.defaultdict(float)
count = collections.Counter()
for r in rows[1:]:
    if r[metric_i] != "gpu__time_duration.sum":
        continue
    v = float(r[value_i].replace(",", ""))
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0,
             "ms": 1e3, "msecond": 1e3}[r[unit_i]]
    name = r[name_i][:44] + (" " + r[grid_i] if grid_i is not None else "")
    total[name] += v * scale
    count[name] += 1
all_us = sum(total.values())
print(f"{'kernel':60s} {'n':>5s} {'total_us':>10s} {'mean_us':>9s}")
for name, us in sorted(total.items(), key=lambda kv: -kv[1]):
    print(f"{name:60s} {count[name]:5d} {us:10.1f} {us / count[name]:9.2f}")
print(f"{'all':60s} {sum(count.values()):5d} {all_us:10.1f}")
