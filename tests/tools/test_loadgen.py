"""tools/loadgen/loadgen.py against real processes: scheduler and direct
worker side by side, its JSON report, and errors counted by status code."""
import json
import os
import subprocess
import sys

from tools_cluster import BURST_TOKENS, REPO

LOADGEN = os.path.join(REPO, "tools", "loadgen", "loadgen.py")


def run_loadgen(tmp_path, *args):
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, LOADGEN, "--json", str(out), "--warmup", "0"]
        + list(args), capture_output=True, text=True, timeout=120)
    return proc, (json.loads(out.read_text()) if out.exists() else None)


def test_compare_direct_reports_both_paths(cluster, tmp_path):
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(["def add(a, b):\n", "import os\n"]))
    proc, result = run_loadgen(
        tmp_path, "--address", cluster["scheduler"].address,
        "--direct-worker", cluster["worker"].address, "--compare-direct",
        "--concurrency", "2", "--requests", "4", "--max-tokens", "8",
        "--ignore-eos", "--burst-tokens", str(BURST_TOKENS),
        "--prompts", str(prompts))
    assert proc.returncode == 0, proc.stderr
    # The table and the progress bar.
    assert "scheduler added median latency per burst" in proc.stdout
    assert "TTFT" in proc.stdout and "e2e latency" in proc.stdout
    assert "requests" in proc.stderr
    assert set(result["modes"]) == {"scheduler", "direct"}
    for mode, s in result["modes"].items():
        assert s["requests"] == 4 and s["ok"] == 4, (mode, s)
        assert s["errors"] == {}
        assert s["output_tokens"] == 4 * 8
        for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "per_burst_ms"):
            d = s[key]
            assert d["p50"] is not None and 0 < d["p50"] <= d["p90"] <= d["p99"]
        assert s["requests_per_s"] > 0 and s["output_tokens_per_s"] > 0
        assert s["bursts_per_request"] == 8 / BURST_TOKENS
    records = result["requests"]
    assert len(records) == 8
    assert all(r["tokens"] == 8 and r["status"] == "OK" for r in records)
    assert {r["prompt_index"] for r in records} == {0, 1}
    # One burst boundary per request (8 tokens in bursts of 4), seen on both
    # paths (plain decode: one token per message).
    assert result["modes"]["direct"]["burst_gap_ms"]["n"] == 4
    assert result["modes"]["scheduler"]["burst_gap_ms"]["n"] > 0
    assert all(r["burst_starts"] == [BURST_TOKENS] for r in records
               if r["mode"] == "direct")
    c = result["compare"]
    for key in ("ttft_ms", "e2e_ms", "per_burst_ms", "tpot_ms", "burst_gap_ms"):
        assert set(c[key]) == {"scheduler", "direct", "added"}
        assert c[key]["added"] is not None
    assert c["paired_prompts"] == 2
    assert c["prompts_with_equal_token_counts"] == 2


def test_speculative_requests_report_rounds(cluster, tmp_path):
    proc, result = run_loadgen(
        tmp_path, "--address", cluster["scheduler"].address,
        "--direct-worker", cluster["worker"].address, "--compare-direct",
        "--requests", "2", "--max-tokens", "12", "--k", "2",
        "--burst-tokens", str(BURST_TOKENS), "--quiet")
    assert proc.returncode == 0, proc.stderr
    direct = result["modes"]["direct"]
    assert direct["ok"] == 2 and direct["spec_rounds"] > 0
    assert 1 <= direct["spec_tokens_per_round"] <= 3


def test_errors_are_counted_by_status_code(cluster, tmp_path):
    # max_tokens over the model's context: every request is refused.
    proc, result = run_loadgen(
        tmp_path, "--address", cluster["scheduler"].address,
        "--requests", "3", "--max-tokens", "100000", "--quiet")
    assert proc.returncode == 1  # nothing succeeded
    s = result["modes"]["scheduler"]
    assert s["ok"] == 0 and s["errors"] == {"INVALID_ARGUMENT": 3}
    assert "INVALID_ARGUMENT 3" in proc.stdout
    assert all(r["error"] for r in result["requests"])
