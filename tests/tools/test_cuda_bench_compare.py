"""tools/cuda_bench.sh's comparison modes without a GPU: `ab` (kept builds,
one base against several) and `envab` (one build under two environments)
run stub cuda_bench binaries that write the JSON the real one writes; the
table and JSON come from tools/cuda_bench/ab_compare.py."""
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
COMPARE = os.path.join(REPO, "tools", "cuda_bench", "ab_compare.py")

# A stub cuda_bench: every 27B-shape time is its base times SCALE (its own
# constant, or the EXP_SCALE of its environment).
STUB = r"""#!/usr/bin/env python3
import json, os, sys
scale = float(os.environ.get("EXP_SCALE", "{scale}"))
path = [a[len("--json="):] for a in sys.argv if a.startswith("--json=")][0]
json.dump({{"model_27b": {{
    "floor_ms": 12.0, "decode_ms": 14.5 * scale, "decode_greedy_ms": 14.0 * scale,
    "verify": [{{"columns": 4, "greedy_ms": 15.4 * scale, "x_greedy_decode": 1.1}}],
    "decode_batch": [{{"B": 1, "greedy_ms": 14.0 * scale}},
                     {{"B": 64, "greedy_ms": 33.6 * scale, "greedy_x_b1": 2.4}}]}}}},
          open(path, "w"))
print("    greedy (no logits copy): %.2f ms" % (14.0 * scale))
"""


def write_stub(path, scale):
    path.write_text(STUB.format(scale=scale))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def fake_repo(tmp_path):
    """The script and the comparer in a tree of their own (the script works
    from its repository root)."""
    root = tmp_path / "repo"
    (root / "tools" / "cuda_bench").mkdir(parents=True)
    shutil.copy(os.path.join(REPO, "tools", "cuda_bench.sh"), root / "tools")
    shutil.copy(COMPARE, root / "tools" / "cuda_bench")
    return root


def run_script(root, out, *args, env=None):
    return subprocess.run(
        ["bash", str(root / "tools" / "cuda_bench.sh")] + list(args),
        capture_output=True, text=True, timeout=120,
        env=dict(os.environ, OUT=str(out), **(env or {})))


def test_ab_compares_a_base_with_several_builds(tmp_path):
    root = fake_repo(tmp_path)
    (root / ".carry" / "ab").mkdir(parents=True)
    for name, scale in (("base", 1.0), ("faster", 0.9), ("slower", 1.2)):
        stub = tmp_path / "cuda_bench"
        write_stub(stub, scale)
        with tarfile.open(root / ".carry" / "ab" / f"{name}.tar.xz", "w:xz") as tar:
            tar.add(stub, arcname="cuda_bench")
    out = tmp_path / "out"
    proc = run_script(root, out, "ab", "base", "faster,slower", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Every build ran each round, in turn.
    order = [line.split()[1].rstrip(",") for line in proc.stdout.splitlines()
             if line.startswith("== ")]
    assert order == ["base", "faster", "slower"] * 2
    result = json.loads((out / "ab.json").read_text())
    assert result["base"] == "base" and result["new"] == ["faster", "slower"]
    assert result["rounds"] == [2, 2, 2]
    rows = {r["figure"]: r for r in result["figures"]}
    greedy = rows["(a) decode ms, greedy"]
    assert abs(greedy["base"] - 14.0) < 1e-9
    assert abs(greedy["faster_over_base"] - 0.9) < 1e-9
    assert abs(greedy["slower_over_base"] - 1.2) < 1e-9
    assert "(c) B=64 / B=1, greedy" in rows


def test_envab_runs_one_build_under_two_environments(tmp_path):
    root = fake_repo(tmp_path)
    (root / ".carry" / "cuda").mkdir(parents=True)
    write_stub(root / ".carry" / "cuda" / "cuda_bench", 1.0)
    out = tmp_path / "out"
    proc = run_script(root, out, "envab", "1", "", "EXP_SCALE=0.8 OTHER=1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((out / "ab.json").read_text())
    rows = {r["figure"]: r for r in result["figures"]}
    assert abs(rows["(a) decode ms, greedy"]["new_over_base"] - 0.8) < 1e-9
    assert abs(rows["(b) verify 4 cols, greedy ms"]["base"] - 15.4) < 1e-9


def test_compare_names_a_build_without_runs(tmp_path):
    (tmp_path / "base_1.json").write_text(json.dumps({"model_27b": {
        "floor_ms": 12.0, "decode_ms": 14.5, "decode_greedy_ms": 14.0}}))
    proc = subprocess.run(
        [sys.executable, COMPARE, "base", "new", str(tmp_path / "ab.json"),
         str(tmp_path / "base_1.json")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "no runs of new" in proc.stderr
