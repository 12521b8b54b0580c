"""tools/serve_bench on the CPU: the random-checkpoint writer's output loads
in a real worker (sharded, with the MTP head and an untied lm_head), and the
benchmark's smoke mode runs end to end (checkpoint, worker, scheduler, gRPC
load) with every row present and no errors."""
import importlib.util
import json
import math
import os
import subprocess
import sys

import specserve_procs as procs
from reflection_client import ReflectionClient
from tools_cluster import REPO

TOOL = os.path.join(REPO, "tools", "serve_bench")
_spec = importlib.util.spec_from_file_location(
    "serve_bench_make_checkpoint", os.path.join(TOOL, "make_checkpoint.py"))
make_checkpoint = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_checkpoint)

# The 27B shape's naming and layer pattern at a size a CPU loads at once.
SCALED = ["--layers", "4", "--hidden", "256", "--intermediate", "512",
          "--vocab", "6144", "--heads", "4", "--kv-heads", "2", "--head-dim", "64",
          "--linear-key-heads", "2", "--linear-value-heads", "4",
          "--linear-head-dim", "64"]


def make(out, *extra):
    return subprocess.run(
        [sys.executable, os.path.join(TOOL, "make_checkpoint.py"), "--out", str(out),
         "--backend", "numpy"] + SCALED + list(extra),
        capture_output=True, text=True, timeout=120)


def test_random_checkpoint_loads_in_the_worker(tmp_path):
    out = tmp_path / "model"
    p = make(out, "--shard-gb", "0.004")
    assert p.returncode == 0, p.stdout + p.stderr
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1
    config = json.loads((out / "config.json").read_text())
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert (out / "tokenizer.json").exists()  # its ids fit the vocabulary
    names = set(index["weight_map"])
    assert {"model.embed_tokens.weight", "lm_head.weight", "mtp.fc.weight",
            "model.layers.3.self_attn.q_proj.weight",
            "model.layers.0.linear_attn.in_proj_qkv.weight"} <= names

    worker = procs.start_worker(model=str(out), extra=["--threads=1"])
    try:
        client = ReflectionClient(worker.address)
        info = client.call("specserve.worker.v1.Worker/GetWorkerInfo")
        client.close()
    finally:
        worker.stop()
    m = info.model
    assert m.has_mtp and not m.tie_word_embeddings
    assert (m.num_layers, m.hidden_size, m.vocab_size) == (4, 256, 6144)
    # Every tensor written is one the worker checks and counts.
    tensors = make_checkpoint.tensor_list(config)
    assert m.parameter_count == sum(math.prod(s) for _, s in tensors)
    assert m.weight_bytes == 2 * m.parameter_count

    # A second call with the same shape keeps the files.
    again = make(out, "--shard-gb", "0.004")
    assert again.returncode == 0 and "already holds" in again.stdout


def test_smoke_mode_runs_every_row_without_errors(tmp_path):
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, os.path.join(TOOL, "serve_bench.py"), "--smoke", "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    result = json.loads((out / "serve_bench.json").read_text())
    rows = result["rows"]
    key = sorted((r["kind"], r["spec"], r["concurrency"], r["prompt_tokens"]) for r in rows)
    assert key == sorted([("decode", False, 1, 32), ("decode", False, 2, 32),
                          ("decode", True, 1, 32), ("decode", True, 2, 32),
                          ("ttft", False, 1, 64), ("ttft", False, 1, 256),
                          ("prefill_load", False, 3, 256)])
    assert result["skipped"] == []
    for r in rows:
        if r["kind"] == "prefill_load":
            continue
        assert r["errors"] == {} and r["cut"] == 0, r
        assert r["done"] == r["requests"] == r["concurrency"] * r["requests_per_client"] > 0
        assert r["ttft_p50_ms"] > 0 and r["ttft_p50_ms"] <= r["ttft_p99_ms"]
        assert r["tok_s"] > 0 and r["client_cpu_pct"] is not None
        assert len(r["records"]) == r["requests"]
        if r["kind"] == "decode":
            assert r["tpot_p50_ms"] > 0 and r["tpot_p50_ms"] <= r["tpot_p99_ms"]
            # ignore_eos: every request runs to max_tokens (a speculative
            # round may commit up to k more).
            assert all(8 <= x["tokens"] <= 8 + r["k"] for x in r["records"]), r["records"]
            assert r["finish"] == ["LENGTH"]
        else:
            assert all(x["tokens"] == 1 for x in r["records"])
    # Prefill under load: a 256-token prompt sent while 3 plain streams
    # decode; the row cancels the streams afterwards, which is no error.
    (pl,) = [r for r in rows if r["kind"] == "prefill_load"]
    assert pl["errors"] == {} and pl["cut"] == 0 and pl["warmup_errors"] == 0, pl
    assert pl["steady"] and pl["window_covered"]
    assert pl["streams"] == 3 and pl["streams_cancelled"] == 3
    assert pl["streams_ended_early"] == 0
    assert pl["done"] == pl["requests"] == 2 + 1 + 3  # solo, prefill, streams
    assert len(pl["solo_ttft_runs_ms"]) == 2 and pl["solo_ttft_ms"] > 0
    assert pl["ttft_load_ms"] > 0
    assert pl["ttft_over_solo"] == pl["ttft_load_ms"] / pl["solo_ttft_ms"]
    assert pl["solo_step_ms"] > 0 and pl["baseline_gaps"] > 0 and pl["window_gaps"] > 0
    assert 0 < pl["gap_p50_ms"] <= pl["gap_p99_ms"] <= pl["gap_max_ms"]
    assert pl["gap_p99_over_step"] == pl["gap_p99_ms"] / pl["solo_step_ms"]
    assert (pl["step_bar"], pl["ttft_bar"]) == (3.0, 1.5)
    assert isinstance(pl["step_ok"], bool) and isinstance(pl["ttft_ok"], bool)
    assert 0 <= pl["prefill_stream_tokens_min"] <= pl["prefill_stream_tokens"]
    roles = sorted((x["role"], x["cancelled_by_row"]) for x in pl["records"])
    assert roles == [("prefill", False)] + [("solo", False)] * 2 + [("stream", True)] * 3
    assert all(x["tokens"] == 1 for x in pl["records"] if x["role"] != "stream")
    assert all(x["tokens"] >= 16 for x in pl["records"] if x["role"] == "stream")
    spec = [r for r in rows if r["spec"]]
    # Alone on the worker the gate starts speculative (a round costs under
    # E plain steps); at c = 2 the CPU's compute-bound costs may make plain
    # decode its first choice, which is neither a round nor a demotion.
    assert all(r["spec_rounds"] > 0 or r["demoted_requests"] > 0
               for r in spec if r["concurrency"] == 1)
    assert all(r.get("x_plain") is not None for r in spec)
    assert result["model"]["has_mtp"]
    text = (out / "serve_bench.txt").read_text()
    for heading in ("## Plain decode", "## Speculative", "## Time to first token",
                    "## Prefill under load", "p99 gap / step (bar <= 3)",
                    "TTFT ratio (bar <= 1.5)"):
        assert heading in text
    assert "requests: 22 done, 0 errors, 0 cut" in text
    assert (out / "worker.log").exists() and (out / "scheduler.log").exists()


def test_smoke_scaling_mode_runs_one_and_two_workers(tmp_path):
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, os.path.join(TOOL, "serve_bench.py"), "--smoke", "--out", str(out),
         "--workers", "2"],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    result = json.loads((out / "serve_bench.json").read_text())
    rows = result["rows"]
    # One worker at c, then two at 2c, for each per-worker c of --smoke (1, 2).
    assert [(r["workers"], r["concurrency"]) for r in rows] == [(1, 1), (1, 2), (2, 2), (2, 4)]
    for r in rows:
        assert r["errors"] == {} and r["cut"] == 0 and r["done"] > 0, r
        assert not r["spec"] and r["kind"] == "decode"
        assert len(r["workers_after"]) == r["workers"], r["workers_after"]
        assert all(w["available"] for w in r["workers_after"])
    one = {r["concurrency"]: r["tok_s"] for r in rows if r["workers"] == 1}
    for r in (r for r in rows if r["workers"] == 2):
        assert r["n_x_one_tok_s"] == 2 * one[r["concurrency"] // 2]
        assert r["over_n_x_one"] == r["tok_s"] / r["n_x_one_tok_s"]
    assert "## Plain decode over 2 workers" in (out / "serve_bench.txt").read_text()


def _serve_bench_modules():
    """context_rows, mixed_rows and serve_bench, imported from the tool's
    folder (they import its siblings by name)."""
    if TOOL not in sys.path:
        sys.path.insert(0, TOOL)
    import context_rows
    import mixed_rows
    import serve_bench
    return context_rows, mixed_rows, serve_bench


def test_context_window_starts_after_the_last_first_token():
    context_rows, _, _ = _serve_bench_modules()
    # Stream 0 decodes every 10 ms from t = 0; stream 1's first token comes
    # at t = 0.5 (its prefill), then every 20 ms. The window opens at 0.5.
    s0 = [(0.01 * i, 1) for i in range(100)]
    s1 = [(0.5 + 0.02 * i, 1) for i in range(10)]
    w = context_rows.window_figures([s0, s1], 0.5, 4, 1000)
    # Stream 0: its 4 messages after 0.5 (0.51 .. 0.54): 3 gaps of 10 ms.
    # Stream 1: 0.52 .. 0.58: 3 gaps of 20 ms (its first token is at 0.5,
    # not after it).
    assert [round(x, 6) for x in w["tpots"]] == [0.01, 0.02]
    assert len(w["gaps"]) == 6 and w["streams_short"] == 0
    assert round(w["window_s"], 6) == 0.08
    # ids in (0.5, 0.58]: stream 0's 8 and stream 1's 4.
    assert w["window_ids"] == 12
    # Context: stream 0 had 51 ids at 0.5, stream 1 one; + half a window.
    assert w["ctx_mean"] == 1000 + (51 + 1) / 2.0 + 2
    assert w["ids_per_message"] == 1.0
    short = context_rows.window_figures([s1], 0.5, 50, 1000)
    assert short["streams_short"] == 1
    # A scheduler that sends 16 ids per message: a 4-id window still takes
    # two messages, so it has a gap to time (one message alone has none).
    bursts = [(0.1 * i, 16) for i in range(1, 6)]
    w = context_rows.window_figures([bursts], 0.1, 4, 1000)
    assert [round(x, 6) for x in w["tpots"]] == [round(0.1 / 16, 6)]


def test_context_fit_check():
    context_rows, _, _ = _serve_bench_modules()
    model = {"layer_types": ["LINEAR_ATTENTION"] * 3 + ["FULL_ATTENTION"],
             "num_key_value_heads": 2, "head_dim": 64, "linear_num_key_heads": 2,
             "linear_num_value_heads": 4, "linear_key_head_dim": 64,
             "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4}
    one = context_rows.session_bytes_lower_bound(model, 1000, 2)
    assert one == 1000 * 1 * 2 * 2 * 64 * 2 + 3 * (4 * 64 * 64 * 2 + (2 * 2 * 64 + 4 * 64) * 3 * 4)
    common = dict(prompt_tokens=900, request_max_tokens=100, window_tokens=16, model=model,
                  kv_element_bytes=2, rate=1000.0, step_ms=10.0)
    assert context_rows.skip_reason(clients=4, budget_bytes=4 * one, seconds_left=100,
                                    **common) == ""
    assert context_rows.skip_reason(clients=5, budget_bytes=4 * one, seconds_left=100,
                                    **common).startswith("memory")
    # 0.9 s alone, 3 more at 3x under load, 48 steps of 10 ms: ~9.4 s.
    assert context_rows.skip_reason(clients=4, budget_bytes=None, seconds_left=5,
                                    **common).startswith("time budget")
    assert context_rows.skip_reason(clients=4, budget_bytes=None, seconds_left=None,
                                    **common) == ""


def test_mixed_window_figures():
    _, mixed_rows, _ = _serve_bench_modules()

    class Rec:
        def __init__(self, ttft):
            self.ttft = ttft

    def req(sent, arrivals):
        q = mixed_rows._Req(0, sent)
        q.arrivals = arrivals
        q.records = [Rec(arrivals[0][0] - sent if arrivals else None)]
        return q

    # Window [1, 2]: a request sent before it (its gaps in it count), one
    # sent in it (its TTFT counts) and one sent in it with no first token.
    a = req(0.0, [(0.1 * i, 1) for i in range(1, 16)])       # arrivals 0.1 .. 1.5
    b = req(1.2, [(1.3 + 0.05 * i, 1) for i in range(10)])  # 1.3 .. 1.75
    c = req(1.9, [])
    w = mixed_rows.window_figures([a, b, c], 1.0, 2.0, 16)
    assert w["requests_in_window"] == 2 and w["ttft_censored"] == 1
    assert [round(x, 6) for x in w["ttft"]] == [0.1]
    # a: gaps arriving at 1.0 .. 1.5 (6 of 0.1 s); b: 9 of 0.05 s. Neither
    # has 15 ids in the window, so neither has a TPOT.
    assert len(w["gaps"]) == 15 and w["tpots"] == []
    assert w["window_ids"] == 6 + 10
    w = mixed_rows.window_figures([a, b, c], 1.0, 2.0, 4)  # 3 ids suffice
    assert [round(x, 6) for x in w["tpots"]] == [0.1, 0.05]


def test_context_and_mixed_flags():
    _, _, serve_bench = _serve_bench_modules()
    assert serve_bench.context_clients(["1,16", "32768:1,4"]) == ([1, 16], {32768: [1, 4]})
    assert serve_bench.context_clients(["8192:1,16;2048:2"]) == (None, {8192: [1, 16],
                                                                         2048: [2]})
    assert serve_bench.mixed_specs("1024:256:64, 8192:1024:16") == [(1024, 256, 64),
                                                                     (8192, 1024, 16)]
    args = serve_bench.parse_args(["--context-rows", "2048,8192,32768"])
    rows = [(k, c, p) for k, _, c, p, _, _ in serve_bench.plan(args) if k == "context"]
    assert rows == [("context", 1, 2048), ("context", 16, 2048), ("context", 1, 8192),
                    ("context", 16, 8192), ("context", 1, 32768), ("context", 4, 32768)]
    # Context rows alone read (h) alone.
    alone = serve_bench.parse_args(["--modes=", "--ttft-prompts=", "--prefill-under-load", "0",
                                    "--context-rows", "8192"])
    assert serve_bench.cuda_bench_sections(alone) == ["--long_context_only",
                                                      "--long_context=8192"]
    assert serve_bench.cuda_bench_sections(args) == []


def test_smoke_context_and_mixed_rows(tmp_path):
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, os.path.join(TOOL, "serve_bench.py"), "--smoke", "--out", str(out),
         "--modes=", "--ttft-prompts=", "--prefill-under-load", "0",
         "--context-rows", "256", "--context-max-tokens", "16",
         "--mixed-rows", "128:16:2", "--mixed-seconds", "4"],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    result = json.loads((out / "serve_bench.json").read_text())
    rows = result["rows"]
    assert [(r["kind"], r["concurrency"]) for r in rows] == [
        ("context", 1), ("context", 2), ("mixed", 2)]
    assert result["skipped"] == []
    for r in rows:
        assert r["errors"] == {} and r["cut"] == 0, r
        assert 0 < r["tpot_p50_ms"] <= r["tpot_p99_ms"] and r["tok_s"] > 0
        assert r["ttft_p50_ms"] > 0 and r["gap_p99_ms"] > 0
    for r in rows[:2]:
        assert r["streams_cancelled"] == r["concurrency"] == r["done"]
        assert r["streams_ended_early"] == 0 and r["streams_short"] == 0
        assert len(r["tpot_streams_ms"]) == r["concurrency"]
        assert r["ctx_mean"] > 256
        assert all(x["cancelled_by_row"] and x["tokens"] >= 16 for x in r["records"])
    (m,) = rows[2:]
    assert m["completed"] > 0 and m["tpot_requests"] > 0
    assert m["done"] == m["completed"] + m["cancelled_at_end"] + 1  # + the probe
    assert len(m["delays_ms"]) == 2
    assert all(0 <= d < m["expected_request_ms"] for d in m["delays_ms"])
    text = (out / "serve_bench.txt").read_text()
    assert "## Decode at long contexts" in text and "## Mixed closed loop" in text
    assert "TPOT / state floor" in text and "TPOT / step" in text


def test_smoke_json_rows_stand_beside_plain(tmp_path):
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, os.path.join(TOOL, "serve_bench.py"), "--smoke", "--out", str(out),
         "--modes", "plain", "--concurrency", "1,2", "--ttft-prompts=",
         "--prefill-under-load", "0", "--json-rows", "1,2"],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    result = json.loads((out / "serve_bench.json").read_text())
    rows = result["rows"]
    assert [(r["kind"], r["concurrency"]) for r in rows] == [
        ("decode", 1), ("decode", 2), ("json", 1), ("json", 2)]
    for r in rows[2:]:
        assert r["errors"] == {} and r["json_schema"] is True, r
        assert r["tpot_over_plain"] > 0 and r["plain_tok_s"] > 0
    text = (out / "serve_bench.txt").read_text()
    assert "## Structured output" in text and "TPOT / plain" in text
