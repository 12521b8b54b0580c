#!/usr/bin/env python3
"""serve_bench: the end-to-end benchmark of specserve as users use it. Real
processes (one specserve_worker, one specserve_scheduler), real gRPC
Generate streams from concurrent clients, each row beside the kernel
benchmark of the same run (tools/cuda_bench) and its bytes floor.

    tools/serve_bench/run.sh [--quick]      # GPU machine (carry .carry/serve)
    tools/serve_bench/serve_bench.py --smoke --out /tmp/sb   # CPU, seconds

Steps (full and --quick, on the GPU):
  1. a random-weight checkpoint of the Qwen3.5-27B text shape in --model
     (default /dev/shm/serve_bench/qwen35_27b; make_checkpoint.py, kept when
     already there);
  2. cuda_bench --skip_matmul (before the worker takes the GPU): DecodeBatch
     step times at B = 1..64, the greedy decode step, prefill, the copy
     bandwidth;
  3. specserve_worker --device cuda:0 and specserve_scheduler, each on
     127.0.0.1:0 (the port read from its "listening on port N" line); ready
     when the scheduler's GetServerInfo shows every worker available;
  4. rows: plain (speculation off) and speculative (enable, k = 3) decode at
     c = 1, 8, 16, 32, 64 closed-loop clients, 128 output tokens (ignore_eos)
     after random 32-token-id prompts; TTFT of 2,048-, 8,192- and
     32,768-token prompts (max_tokens 1, one at a time; --quick: no 32,768);
     prefill under load (prefill_load.py): an 8,192-token prompt's TTFT
     sent while 8 plain streams decode, beside its solo TTFT, and the
     streams' inter-token gaps meanwhile beside their solo step;
     with --shared-prefix P (off by default): N = 32 requests at once that
     share one P-token prefix, after one request alone that brought it
     (shared_prefix.py): their TTFT and cached_prompt_tokens, and the
     worker's memory before, between and after;
     with --context-rows P (off by default): c streams of P-token prompts
     decoding together (context_rows.py), their TPOT after the last one's
     first token beside cuda_bench's (h) step at (P, B = c);
     with --mixed-rows P:O:C (off by default): C clients looping over
     P-token prompts and O output tokens, starts staggered (mixed_rows.py),
     beside the DecodeBatch step at B = C;
  5. $OUT/serve_bench.json (every figure, every request) and
     $OUT/serve_bench.txt (the markdown tables), rewritten after each row,
     plus cuda_bench.{json,txt} and the servers' log tails.

--workers N (N > 1) measures how the service scales over N workers (one per
GPU, --devices, default cuda:0..N-1): plain decode rows at each per-GPU
concurrency c of --concurrency, first with one worker at c, then with N
workers at N * c, so each N-worker figure stands beside N x the one-worker
figure of the same run. Speculative, TTFT, prefill-under-load and
shared-prefix rows are not run in this mode.

--smoke runs the same code on the CPU in seconds: a tiny random checkpoint
(make_checkpoint.py --shape tiny, numpy), bazel-bin's binaries
($SPECSERVE_BIN_DIR), c = 1 and 2, 8 tokens, 64- and 256-token TTFT rows, a
256-token prefill under 3 streams, no cuda_bench. Exit status: 0 when every
row ran with no errors.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

import context_rows  # noqa: E402
import load  # noqa: E402
import make_checkpoint  # noqa: E402
import mixed_rows  # noqa: E402
import prefill_load  # noqa: E402
import report  # noqa: E402
import shared_prefix  # noqa: E402
from reflect import ServerApi  # noqa: E402

_PORT_RE = re.compile(rb"listening on port (\d+)")
LOG_TAIL_BYTES = 4 << 20
# cuda_bench's sparse 27B-shape checkpoint (its weights are filled on the GPU).
CUDA_BENCH_SYNTH = "/tmp/serve_bench_cuda_bench_27b"


class Server:
    """A child process: stdout scanned for its port, stdout and stderr into
    `log`."""

    def __init__(self, name, args, log, env=None):
        self.name, self.args, self.log_path = name, args, log
        self.port = None
        self._seen = threading.Event()
        # Two descriptors, both O_APPEND: the child's stderr and this
        # process's copy of its stdout each write at the file's end (one
        # shared buffered file object lost the child's lines).
        open(log, "wb").close()
        self._log = open(log, "ab", buffering=0)
        self._log.write(("$ " + " ".join(args) + "\n").encode())
        with open(log, "ab") as err:
            self.popen = subprocess.Popen(args, stdout=subprocess.PIPE,
                                          stderr=err, cwd=REPO, env=env)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in iter(self.popen.stdout.readline, b""):
            self._log.write(line)
            m = _PORT_RE.search(line)
            if m and self.port is None:
                self.port = int(m.group(1))
                self._seen.set()
        self._seen.set()

    def wait_port(self, timeout):
        self._seen.wait(timeout)
        if self.port is None:
            raise RuntimeError("%s did not come up in %.0f s (exit %s); see %s:\n%s" % (
                self.name, timeout, self.popen.poll(), self.log_path, tail(self.log_path, 3000)))
        return "127.0.0.1:%d" % self.port

    def stop(self, grace=15.0):
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)  # drains
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        self._log.close()


def tail(path, n):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def find_bin(bin_dir, name):
    for sub in ("", "worker", "scheduler", "tools/cuda_bench"):
        p = os.path.join(bin_dir, sub, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def log(msg):
    print("[serve_bench %s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


def ints(text):
    return [int(x) for x in text.split(",") if x.strip()]


def mixed_specs(text):
    """'P:O:C,...' -> [(P, O, C)]."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        parts = item.split(":")
        if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
            raise argparse.ArgumentTypeError("%r: prompt:output:clients" % item)
        p, o, c = (int(x) for x in parts)
        if p < 1 or o < 2 or c < 1:
            raise argparse.ArgumentTypeError("%r: prompt >= 1, output >= 2, clients >= 1" % item)
        out.append((p, o, c))
    return out


def context_clients(groups):
    """--context-concurrency groups ('C,C2' for every context, 'P:C,C2' for
    context P; several per value with ';' or spaces) -> (default list,
    {P: list})."""
    default, per = None, {}
    for g in groups:
        for item in g.replace(";", " ").split():
            p, _, cs = item.rpartition(":")
            if not p:
                default = ints(cs)
            else:
                per[int(p)] = ints(cs)
    return default, per


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--smoke", action="store_true",
                    help="CPU, tiny random model, seconds (CI)")
    ap.add_argument("--quick", action="store_true",
                    help="a few seconds per row instead of ~25")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/serve_bench"),
                    help="results folder (default $OUT or /tmp/serve_bench)")
    ap.add_argument("--work", help="checkpoint and logs (default /dev/shm/serve_bench; "
                    "--smoke: OUT/work)")
    ap.add_argument("--model", help="model directory (default WORK/qwen35_27b; "
                    "--smoke: WORK/tiny). Written by make_checkpoint.py unless "
                    "--no-make")
    ap.add_argument("--checkpoint-only", action="store_true",
                    help="write (or keep) the checkpoint and stop: a first device "
                    "call, so that the next one fits its rows in 600 s")
    ap.add_argument("--no-make", action="store_true",
                    help="serve --model as it is (e.g. models/default)")
    ap.add_argument("--bin-dir", help="where specserve_worker, specserve_scheduler "
                    "and cuda_bench are (default .carry/serve_bin, run.sh's "
                    "unpacked .carry/serve; --smoke: $SPECSERVE_BIN_DIR or "
                    "bazel-bin)")
    ap.add_argument("--device", help="worker device (default cuda:0; --smoke: cpu)")
    ap.add_argument("--workers", type=int, default=1,
                    help="N > 1: the scaling rows over N workers (see above)")
    ap.add_argument("--devices", help="comma list, one device per worker with "
                    "--workers (default cuda:0..N-1; --smoke: cpu for each)")
    ap.add_argument("--concurrency", type=ints, help="default 1,8,16,32,64 "
                    "(--smoke: 1,2)")
    ap.add_argument("--modes", default="plain,spec", help="plain, spec or both")
    ap.add_argument("--k", type=int, default=3, help="draft depth of the spec rows")
    ap.add_argument("--max-tokens", type=int, help="output tokens per request "
                    "(default 128; --smoke: 8)")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--ttft-prompts", type=ints, help="default 2048,8192,32768 "
                    "(--quick: 2048,8192; --smoke: 64,256); empty: none")
    ap.add_argument("--prefill-under-load", type=ints, metavar="P[,P2...]",
                    help="prompt tokens of the prefill_load rows, one row each "
                    "(default 8192; --smoke: 256); 0 or empty: none")
    ap.add_argument("--load-streams", type=int,
                    help="plain streams decoding during a prefill_load row's "
                    "prefill (default 8; --smoke: 3)")
    ap.add_argument("--load-max-tokens", type=int,
                    help="max_tokens of those streams: well past the prefill, "
                    "which the row cancels them after (default 4096; --smoke: "
                    "2048)")
    ap.add_argument("--shared-prefix", type=ints, default=[], metavar="P[,P2...]",
                    help="prefix tokens of the shared_prefix rows (shared_prefix.py), "
                    "one row per P and --shared-prefix-first variant (default: none)")
    ap.add_argument("--shared-prefix-clients", type=int, default=32,
                    help="requests sent at once after the first (default 32)")
    ap.add_argument("--shared-prefix-suffix", type=int, default=64,
                    help="distinct random suffix tokens per request (default 64)")
    ap.add_argument("--shared-prefix-first", default="suffix,prefix",
                    help="the first request's prompt: suffix (the prefix + its own "
                    "suffix), prefix (the prefix alone) or both, one row each "
                    "(default suffix,prefix)")
    ap.add_argument("--context-rows", type=ints, default=[], metavar="P[,P2...]",
                    help="prompt tokens (the context) of the long-context decode rows "
                    "(context_rows.py), one row per P and client count (default: none; "
                    "e.g. 2048,8192,32768)")
    ap.add_argument("--context-concurrency", action="append", metavar="C[,C2] | P:C[,C2]",
                    help="streams of the context rows: a list for every context, or "
                    "P:list for context P (repeatable, or ';'-separated). Default "
                    "'1,16' and '32768:1,4' (cuda_bench's (h) plan); --smoke: 1,2")
    ap.add_argument("--context-max-tokens", type=int,
                    help="ids each stream decodes in a context row's window, after the "
                    "last stream's first token (default 128; --smoke: 16)")
    ap.add_argument("--context-request-max-tokens", type=int,
                    help="max_tokens of a context row's requests: past what the streams "
                    "decode while the other prompts prefill (the row cancels them once "
                    "the window is done; default 4096; --smoke: 512)")
    ap.add_argument("--json-rows", type=ints, default=[], metavar="C[,C2...]",
                    help="structured-output rows: greedy decode constrained to a JSON "
                         "schema at these concurrencies, beside the plain decode row of "
                         "the same c (run it too: --modes plain --concurrency C,...)")
    ap.add_argument("--mixed-rows", type=mixed_specs, default=[], metavar="P:O:C[,...]",
                    help="mixed closed-loop rows (mixed_rows.py): C clients looping over "
                    "P-token prompts and O output tokens (default: none; e.g. "
                    "1024:256:64,8192:1024:16)")
    ap.add_argument("--mixed-seconds", type=float,
                    help="a mixed row's window, after the last client's start (default "
                    "60; --quick 20; --smoke 2)")
    ap.add_argument("--row-seconds", type=float,
                    help="target seconds per decode row (default 25; --quick 4)")
    ap.add_argument("--ttft-seconds", type=float,
                    help="target seconds per TTFT row (default 12; --quick 2)")
    ap.add_argument("--min-requests", type=int, default=2,
                    help="least requests per client in a row")
    ap.add_argument("--max-requests", type=int, default=64,
                    help="most requests per client in a row")
    ap.add_argument("--requests", type=int,
                    help="exactly this many requests per client (no sizing)")
    ap.add_argument("--budget-s", type=float,
                    help="cut requests still running this many seconds after the "
                    "start, and start no row in the last 15 s before (default "
                    "540: a device call is 600 s; --smoke: none)")
    ap.add_argument("--cuda-bench", dest="cuda_bench_bin",
                    help="cuda_bench binary (default BIN_DIR/cuda_bench)")
    ap.add_argument("--cuda-bench-arg", action="append", default=[],
                    help="extra cuda_bench flag (repeatable), e.g. --long_context=8192")
    ap.add_argument("--cuda-bench-json",
                    help="use this cuda_bench JSON instead of running it")
    ap.add_argument("--no-cuda-bench", action="store_true")
    ap.add_argument("--worker-arg", action="append", default=[],
                    help="extra specserve_worker flag (repeatable)")
    ap.add_argument("--scheduler-arg", action="append", default=[],
                    help="extra specserve_scheduler flag (repeatable)")
    ap.add_argument("--max-restarts", type=int, default=2,
                    help="start the servers again (at most this often) when one "
                    "died during a row, so that the later rows still run")
    ap.add_argument("--startup-timeout", type=float, default=600.0,
                    help="seconds for the worker to load and listen")
    ap.add_argument("--request-timeout", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep-records", action="store_true",
                    help="every request's record in the JSON (default: only "
                    "with --smoke or when small)")
    args = ap.parse_args(argv)
    s = args.smoke
    args.mode = "smoke" if s else ("quick" if args.quick else "full")
    args.work = args.work or (os.path.join(args.out, "work") if s else "/dev/shm/serve_bench")
    if args.model is None:
        args.model = os.path.join(args.work, "tiny" if s else "qwen35_27b")
    if args.bin_dir is None:
        args.bin_dir = (os.environ.get("SPECSERVE_BIN_DIR", os.path.join(REPO, "bazel-bin"))
                        if s else os.path.join(REPO, ".carry", "serve_bin"))
    args.device = args.device or ("cpu" if s else "cuda:0")
    args.concurrency = args.concurrency or ([1, 2] if s else [1, 8, 16, 32, 64])
    args.max_tokens = args.max_tokens or (8 if s else 128)
    if args.ttft_prompts is None:
        args.ttft_prompts = ([64, 256] if s else
                             [2048, 8192] if args.quick else [2048, 8192, 32768])
    if args.prefill_under_load is None:
        args.prefill_under_load = [256] if s else [8192]
    args.prefill_under_load = [p for p in args.prefill_under_load if p > 0]
    args.shared_prefix = [p for p in args.shared_prefix if p > 0]
    args.shared_prefix_first = [v for v in args.shared_prefix_first.split(",") if v]
    if set(args.shared_prefix_first) - set(shared_prefix.VARIANTS):
        ap.error("--shared-prefix-first: %s" % " and/or ".join(shared_prefix.VARIANTS))
    if args.shared_prefix_clients < 1 or args.shared_prefix_suffix < 1:
        ap.error("--shared-prefix-clients and --shared-prefix-suffix: at least 1")
    args.load_streams = args.load_streams or (3 if s else 8)
    args.load_max_tokens = args.load_max_tokens or (2048 if s else 4096)
    # prefill_load: solo TTFT requests after the warm-up, and the seconds of
    # steady decode whose gaps give the solo step.
    args.solo_repeats = 2 if s else 3
    args.baseline_s = 0.25 if s else 1.0
    try:
        default, per = context_clients(args.context_concurrency or
                                       (["1,2"] if s else ["1,16", "32768:1,4"]))
    except ValueError:
        ap.error("--context-concurrency: C[,C2...] or P:C[,C2...]")
    if default is None:
        default = [1, 2] if s else [1, 16]
    args.context_clients = {p: [c for c in per.get(p, default) if c > 0]
                            for p in args.context_rows if p > 0}
    args.context_rows = [p for p in args.context_rows if p > 0]
    args.context_max_tokens = args.context_max_tokens or (16 if s else 128)
    args.context_request_max_tokens = args.context_request_max_tokens or (512 if s else 4096)
    if args.context_max_tokens < 2:
        ap.error("--context-max-tokens: at least 2 (a TPOT needs two tokens)")
    if args.context_request_max_tokens <= args.context_max_tokens:
        ap.error("--context-request-max-tokens: more than --context-max-tokens")
    args.mixed_seconds = args.mixed_seconds or (2.0 if s else (20.0 if args.quick else 60.0))
    args.row_seconds = args.row_seconds or (0.5 if s else (4.0 if args.quick else 25.0))
    args.ttft_seconds = args.ttft_seconds or (0.3 if s else (2.0 if args.quick else 12.0))
    if s and args.requests is None:
        args.requests = 2
    if args.budget_s is None and not s:
        args.budget_s = 540.0
    args.modes = [m for m in args.modes.split(",") if m]
    if set(args.modes) - {"plain", "spec"}:
        ap.error("--modes: plain and/or spec")
    if args.workers < 1:
        ap.error("--workers: at least 1")
    if args.devices:
        args.devices = [d for d in args.devices.split(",") if d]
    elif args.workers > 1:
        args.devices = (["cpu"] * args.workers if s else
                        ["cuda:%d" % i for i in range(args.workers)])
    else:
        args.devices = [args.device]
    if len(args.devices) != args.workers:
        ap.error("--devices: %d devices for --workers %d" % (len(args.devices), args.workers))
    return args


def make_model(args, result):
    if args.no_make:
        return
    cmd = [sys.executable, os.path.join(HERE, "make_checkpoint.py"), "--out", args.model]
    shape = "tiny" if args.smoke else "27b"
    if args.smoke:
        cmd += ["--shape", "tiny", "--backend", "numpy"]
    # The model context (max_position_embeddings) bounds a request's prompt +
    # max_tokens in the scheduler and a session's capacity in the worker:
    # raised only past the shape's own, so that the usual runs keep their
    # checkpoint's stamp (and the 27B one its 55 GB on /dev/shm).
    need = context_needed(args)
    if need > make_checkpoint.SHAPES[shape]["max_position"]:
        cmd += ["--max-position", str(need)]
    log("checkpoint: " + " ".join(cmd[1:]))
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    sys.stdout.write(p.stdout)
    if p.returncode != 0:
        raise SystemExit("serve_bench: make_checkpoint failed (exit %d)" % p.returncode)
    stamp = json.load(open(os.path.join(args.model, "serve_bench_checkpoint.json")))
    result["checkpoint"] = {
        "dir": args.model, "bytes": sum(stamp["files"].values()),
        "kept": "already holds" in p.stdout, "seconds": stamp.get("seconds"),
        "device": stamp.get("device"), "call_seconds": time.monotonic() - t0,
        "tokenizer": os.path.exists(os.path.join(args.model, "tokenizer.json"))}


def row_context(args, kind, p, n_tok):
    """The most rows one request of a plan row takes (prompt + max_tokens):
    a prefill_load row's are its prompt's (max_tokens 1) or its streams';
    a shared_prefix row's the prefix + a suffix + max_tokens."""
    if kind == "prefill_load":
        return max(p + 1, args.prompt_tokens + n_tok)
    if kind == "shared_prefix":
        return p + args.shared_prefix_suffix + n_tok
    if kind == "context":
        return p + args.context_request_max_tokens
    return p + n_tok


def context_needed(args):
    """The most rows one request of the plan takes."""
    return max([row_context(args, kind, p, n) for kind, _, _, p, n, _ in plan(args)] or [0])


def cuda_bench_sections(args):
    """cuda_bench flags for the sections the plan reads: none (its full run:
    (a) and (c) for the decode and mixed rows, (f) for the TTFT rows, (h)
    for the context and mixed rows) unless context rows are the only rows
    that read it: then (h) alone (--long_context_only, with
    --long_context=P when they are all at one of (h)'s contexts)."""
    kinds = {kind for kind, _, _, _, _, _ in plan(args)}
    if "context" not in kinds or kinds & {"decode", "ttft", "mixed"}:
        return []
    flags = ["--long_context_only"]
    if len(set(args.context_rows)) == 1 and args.context_rows[0] in context_rows.BENCH_CONTEXTS:
        flags.append("--long_context=%d" % args.context_rows[0])
    return flags


def run_cuda_bench(args, result):
    if args.cuda_bench_json:
        result["cuda_bench"] = json.load(open(args.cuda_bench_json))
        result["cuda_bench_note"] = "from " + args.cuda_bench_json
        return
    if args.no_cuda_bench or args.smoke or not args.device.startswith("cuda"):
        result["cuda_bench_note"] = "not run (%s)" % (
            "--smoke" if args.smoke else "--no-cuda-bench" if args.no_cuda_bench
            else "no GPU device")
        return
    b = args.cuda_bench_bin or find_bin(args.bin_dir, "cuda_bench")
    if not b:
        result["cuda_bench_note"] = "not run: no cuda_bench in " + args.bin_dir
        log(result["cuda_bench_note"])
        return
    js, txt = os.path.join(args.out, "cuda_bench.json"), os.path.join(args.out, "cuda_bench.txt")
    cmd = ([b, "--skip_matmul", "--json=" + js, "--synthetic_dir=" + CUDA_BENCH_SYNTH]
           + cuda_bench_sections(args) + args.cuda_bench_arg)
    log("cuda_bench: " + " ".join(cmd))
    t0 = time.monotonic()
    with open(txt, "w") as f:
        try:
            rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO,
                                 timeout=400)
        except subprocess.TimeoutExpired:
            rc = "timeout (400 s)"
    log("cuda_bench: exit %s in %.0f s" % (rc, time.monotonic() - t0))
    if os.path.exists(js):
        result["cuda_bench"] = json.load(open(js))
        result["cuda_bench_note"] = "same run, exit %s" % rc
    else:
        result["cuda_bench_note"] = "failed (exit %s): see cuda_bench.txt" % rc
    shutil.rmtree(CUDA_BENCH_SYNTH, ignore_errors=True)


def model_info_dict(msg):
    from google.protobuf import json_format
    d = json_format.MessageToDict(msg, preserving_proto_field_name=True)
    for k in ("parameter_count", "weight_bytes"):
        if k in d:
            d[k] = int(d[k])
    return d


def start_servers(args, result, servers, n_workers=1):
    """Starts the first n_workers of args.devices and a scheduler over them;
    returns (api, scheduler address, {name: pid}, the servers started)."""
    worker_bin = find_bin(args.bin_dir, "specserve_worker")
    sched_bin = find_bin(args.bin_dir, "specserve_scheduler")
    if not worker_bin or not sched_bin:
        raise SystemExit("serve_bench: no specserve_worker/specserve_scheduler in %s (for "
                         "the GPU machine: run tools/cuda_bench.sh prepare on the build "
                         "machine, carry .carry/serve, start tools/serve_bench/run.sh)"
                         % args.bin_dir)
    t0 = time.monotonic()
    n = sum(1 for x in servers if x.name == "scheduler")  # earlier incarnations
    suffix = ".%d" % n if n else ""
    started = []
    for i, device in enumerate(args.devices[:n_workers]):
        w = Server("worker", [worker_bin, "--device", device, "--model", args.model,
                              "--listen", "127.0.0.1:0"] + args.worker_arg,
                   os.path.join(args.work, "worker%s%s.log" % (i or "", suffix)))
        servers.append(w)
        started.append(w)
    # The workers load their weights in parallel.
    waddrs = [w.wait_port(args.startup_timeout) for w in started]
    for device, waddr in zip(args.devices, waddrs):
        log("worker %s on %s after %.1f s" % (waddr, device, time.monotonic() - t0))
    # Every request of a row runs at once: a prefill_load row's prefill
    # beside its streams, too (a queued one would wait for a stream's end),
    # and a shared_prefix row's N.
    max_running = max([c * n_workers for c in args.concurrency] +
                      [c + 1 for kind, _, c, _, _, _ in plan(args) if kind == "prefill_load"] +
                      [c for kind, _, c, _, _, _ in plan(args)
                       if kind in ("shared_prefix", "context", "mixed")])
    # A carried scheduler brings the shared libraries it loads (libcpp-httplib
    # and its dependencies: tools/cuda_bench.sh prepare) in lib/ beside it.
    env = None
    lib = os.path.join(os.path.dirname(sched_bin), "lib")
    if os.path.isdir(lib):
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            [os.path.abspath(lib)] + [p for p in [env.get("LD_LIBRARY_PATH")] if p])
    s = Server("scheduler", [sched_bin, "--workers", ",".join(waddrs), "--listen", "127.0.0.1:0",
                             "--model", args.model, "--max_running", str(max_running)]
               + args.scheduler_arg, os.path.join(args.work, "scheduler%s.log" % suffix),
               env=env)
    servers.append(s)
    started.append(s)
    saddr = s.wait_port(60)
    api = ServerApi(saddr)
    deadline = time.monotonic() + 120
    while True:
        info = api.call("specserve.v1.Admin/GetServerInfo", timeout=10)
        if len(info.workers) == n_workers and all(x.available for x in info.workers):
            break
        if time.monotonic() > deadline:
            raise SystemExit("serve_bench: not every worker is available to the scheduler: %s"
                             % info)
        time.sleep(0.2)
    log("scheduler %s ready after %.1f s" % (saddr, time.monotonic() - t0))
    result["model"] = model_info_dict(info.model)
    # A --scheduler-arg=--max_running=N comes later on the command line and
    # wins: report the limit the scheduler runs with.
    max_running = int(next((a.split("=", 1)[1] for a in reversed(args.scheduler_arg)
                            if a.startswith("--max_running=")), max_running))
    result["meta"].update(worker_address=",".join(waddrs), scheduler_address=saddr,
                          max_running=max_running, startup_s=time.monotonic() - t0,
                          worker_pid=started[0].popen.pid, scheduler_pid=s.popen.pid,
                          worker_device=info.workers[0].device, workers=n_workers,
                          burst_tokens=next((a.split("=", 1)[1] for a in args.scheduler_arg
                                             if a.startswith("--burst_tokens=")), 32))
    # CPU shares: the first worker stands for all of them.
    return api, saddr, {"worker": started[0].popen.pid, "scheduler": s.popen.pid}, started


def write_results(args, result):
    report.annotate(result)
    text = report.tables(result)
    tmp = os.path.join(args.out, "serve_bench.json.tmp")
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, os.path.join(args.out, "serve_bench.json"))
    with open(os.path.join(args.out, "serve_bench.txt"), "w") as f:
        f.write(text)
    return text


def plan(args):
    """[(kind, spec, concurrency, prompt tokens, max tokens, workers)]; a
    shared_prefix row's spec is its first-request variant (a str), its
    concurrency N, its prompt tokens the prefix's."""
    if args.workers > 1:
        return [("decode", False, c * n, args.prompt_tokens, args.max_tokens, n)
                for n in (1, args.workers) for c in args.concurrency]
    rows = []
    for mode in args.modes:
        for c in args.concurrency:
            rows.append(("decode", mode == "spec", c, args.prompt_tokens, args.max_tokens, 1))
    for p in args.ttft_prompts:
        rows.append(("ttft", False, 1, p, 1, 1))
    # concurrency: the decoding streams; max tokens: theirs (the prefill's is 1).
    for p in args.prefill_under_load:
        rows.append(("prefill_load", False, args.load_streams, p, args.load_max_tokens, 1))
    for p in args.shared_prefix:
        for first in args.shared_prefix_first:
            rows.append(("shared_prefix", first, args.shared_prefix_clients, p,
                         shared_prefix.SHARED_MAX_TOKENS, 1))
    # max tokens: the window's ids per stream (a request's: row_context).
    for p in args.context_rows:
        for c in args.context_clients[p]:
            rows.append(("context", False, c, p, args.context_max_tokens, 1))
    for p, o, c in args.mixed_rows:
        rows.append(("mixed", False, c, p, o, 1))
    for c in args.json_rows:
        rows.append(("json", False, c, args.prompt_tokens, args.max_tokens, 1))
    return rows


class GpuMemory:
    """The most GPU memory in use (nvidia-smi, MiB) while `with` runs, sampled
    every second; None without nvidia-smi."""

    def __init__(self, device):
        self.index = device.split(":", 1)[1] if device.startswith("cuda:") else None
        self.smi = shutil.which("nvidia-smi") if self.index is not None else None
        self.peak = None

    def _sample(self):
        try:
            out = subprocess.run([self.smi, "-i", self.index, "--query-gpu=memory.used",
                                  "--format=csv,noheader,nounits"], capture_output=True,
                                 text=True, timeout=10).stdout
            v = int(out.strip().splitlines()[0])
            self.peak = v if self.peak is None else max(self.peak, v)
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            pass

    def __enter__(self):
        self._stop = threading.Event()
        if self.smi:
            def run():
                while not self._stop.wait(1.0):
                    self._sample()
            self._thread = threading.Thread(target=run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self.smi:
            self._thread.join()
            self._sample()


def worker_status(api):
    """[{address, available, detail}] from the scheduler, or a one-entry
    list with the error."""
    try:
        info = api.call("specserve.v1.Admin/GetServerInfo", timeout=10)
        return [{"address": w.address, "available": w.available, "detail": w.detail,
                 "sessions": w.sessions} for w in info.workers]
    except Exception as e:  # the scheduler itself is gone or stuck
        return [{"error": repr(e)[:300]}]


def wait_available(api, timeout):
    """'' once every worker is available to the scheduler; else why not
    after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        ws = worker_status(api)
        if ws and all(w.get("available") for w in ws):
            return ""
        if time.monotonic() > deadline:
            return "; ".join(w.get("detail") or w.get("error") or "unavailable" for w in ws)
        time.sleep(0.5)


def context_skip(args, result, c, p, t_start):
    """'' when a context row may run; else why it would not fit: the
    worker's session memory or the time budget (context_rows.skip_reason)."""
    kv_bytes, _ = shared_prefix.kv_element_bytes(args.worker_arg, args.devices[0])
    bench = result.get("cuda_bench")
    e = report.bench_long_context(bench, p, c) or report.bench_batch(bench, c)
    step = (e.get("greedy_ms") or e.get("ms")) if e else None
    left = (args.budget_s - 15 - (time.monotonic() - t_start)) if args.budget_s else None
    return context_rows.skip_reason(
        clients=c, prompt_tokens=p, request_max_tokens=args.context_request_max_tokens,
        window_tokens=args.context_max_tokens, model=result["model"],
        kv_element_bytes=kv_bytes,
        budget_bytes=context_rows.worker_budget_bytes(
            result["meta"]["worker_address"].split(",")[0]),
        rate=context_rows.prefill_rate(result, p), step_ms=step, seconds_left=left)


def run_rows(args, result, t_start, servers):
    rows = plan(args)
    n_live = rows[0][5] if rows else 1
    api, saddr, pids, live = start_servers(args, result, servers, n_live)
    client = load.LoadClient(api, saddr, timeout_s=args.request_timeout)
    vocab = int(result["model"]["vocab_size"])
    restarts = 0
    for i, (kind, spec, c, p, n_tok, n_workers) in enumerate(rows):
        tag = ("/first=" + spec) if isinstance(spec, str) else "/spec" if spec else ""
        name = "%s%s c=%d prompt=%d%s" % (kind, tag, c, p,
                                          " workers=%d" % n_workers if args.workers > 1 else "")
        if n_workers != n_live:
            # The scaling rows' second half: the same load spread over more workers.
            for x in reversed(live):
                x.stop()
            api.close()
            n_live = n_workers
            api, saddr, pids, live = start_servers(args, result, servers, n_live)
            client = load.LoadClient(api, saddr, timeout_s=args.request_timeout)
        dead = ["%s exited with status %s" % (x.name, x.popen.returncode) for x in live
                if x.popen.poll() is not None]
        if not dead:
            why = wait_available(api, 30.0)
            if why:
                dead = ["a worker is not available to the scheduler after 30 s: " + why]
        if dead and restarts < args.max_restarts:
            # A server died in the last row (its errors are in that row):
            # start both again so that the rows after it still run.
            restarts += 1
            result["restarts"].append("before %s: %s" % (name, "; ".join(dead)))
            log("restart (%s)" % result["restarts"][-1])
            for x in reversed(live):
                x.stop()
            api.close()
            api, saddr, pids, live = start_servers(args, result, servers, n_live)
            client = load.LoadClient(api, saddr, timeout_s=args.request_timeout)
            dead = []
        if dead:
            result["skipped"].append("%s (%s)" % (name, "; ".join(dead)))
            log("skip " + result["skipped"][-1])
            continue
        elapsed = time.monotonic() - t_start
        if args.budget_s and elapsed > args.budget_s - 15:
            result["skipped"].append("%s (time budget: %.0f s of %.0f s used)" % (
                name, elapsed, args.budget_s))
            log("skip " + result["skipped"][-1])
            continue
        max_context = int(result["model"].get("max_context") or 0)
        need = row_context(args, kind, p, n_tok)
        if max_context and need > max_context:
            # The scheduler would refuse such requests (prompt + max_tokens
            # past the model context).
            result["skipped"].append("%s (%d rows of prompt + max_tokens exceed the "
                                     "model context %d)" % (name, need, max_context))
            log("skip " + result["skipped"][-1])
            continue
        why = context_skip(args, result, c, p, t_start) if kind == "context" else ""
        if why:
            result["skipped"].append("%s (%s)" % (name, why))
            log("skip " + result["skipped"][-1])
            continue
        log("row " + name)
        decode = kind in ("decode", "json")
        hard_s = (args.budget_s - (time.monotonic() - t_start)) if args.budget_s else None
        with GpuMemory(args.devices[0]) as mem:
            if kind == "prefill_load":
                s = prefill_load.run_row(
                    client, prompt_tokens=p, streams=c, stream_prompt_tokens=args.prompt_tokens,
                    stream_max_tokens=n_tok, vocab=vocab, seed=args.seed * 1000 + i,
                    solo_repeats=args.solo_repeats, baseline_s=args.baseline_s,
                    pids=pids, hard_s=hard_s)
            elif kind == "shared_prefix":
                kv_bytes, kv_note = shared_prefix.kv_element_bytes(args.worker_arg,
                                                                   args.devices[0])
                s = shared_prefix.run_row(
                    client, result["meta"]["worker_address"].split(",")[0],
                    prefix_tokens=p, clients=c, suffix_tokens=args.shared_prefix_suffix,
                    first=spec, vocab=vocab, seed=args.seed * 1000 + i,
                    model=result["model"], kv_element_bytes=kv_bytes, kv_dtype_note=kv_note,
                    pids=pids, hard_s=hard_s)
            elif kind == "context":
                s = context_rows.run_row(
                    client, prompt_tokens=p, clients=c, window_tokens=n_tok,
                    request_max_tokens=args.context_request_max_tokens, vocab=vocab,
                    seed=args.seed * 1000 + i, pids=pids, hard_s=hard_s)
            elif kind == "mixed":
                e = report.bench_batch(result.get("cuda_bench"), c)
                s = mixed_rows.run_row(
                    client, prompt_tokens=p, output_tokens=n_tok, clients=c,
                    seconds=args.mixed_seconds, step_s=e["greedy_ms"] / 1e3 if e else None,
                    vocab=vocab, seed=args.seed * 1000 + i, pids=pids, hard_s=hard_s)
            else:
                s = load.run_row(
                    client, concurrency=c, prompt_tokens=p, max_tokens=n_tok, spec=spec,
                    k=args.k, vocab=vocab,
                    target_s=args.row_seconds if decode else args.ttft_seconds,
                    min_requests=args.min_requests if decode else 1,
                    max_requests=args.max_requests, seed=args.seed * 1000 + i,
                    pids=pids, fixed_requests=args.requests, hard_s=hard_s,
                    json_schema=load.JSON_ROW_SCHEMA if kind == "json" else None)
        s["kind"] = kind
        s["workers"] = n_workers
        s["gpu_memory_peak_mib"] = mem.peak
        s["workers_after"] = worker_status(api)
        if not (args.keep_records or args.smoke or len(s["records"]) <= 64):
            s["records"] = s["records"][:64]
            s["records_truncated"] = True
        result["rows"].append(s)
        if kind == "prefill_load":
            what = ("solo step %s ms, gap p99 %s ms (%s x, bar %g), TTFT %s ms under load, "
                    "%s ms solo (%s x, bar %g)," % (
                        report._f(s.get("solo_step_ms"), "%.2f"),
                        report._f(s.get("gap_p99_ms"), "%.2f"),
                        report._f(s.get("gap_p99_over_step"), "%.2f"), s["step_bar"],
                        report._f(s.get("ttft_load_ms")), report._f(s.get("solo_ttft_ms")),
                        report._f(s.get("ttft_over_solo"), "%.2f"), s["ttft_bar"]))
        elif kind == "shared_prefix":
            what = ("first TTFT %s ms (cached %s), the %d: TTFT p50 %s ms (bar %g), "
                    "cached min %s (target %d), per-request %s MiB, source %s MiB," % (
                        report._f(s.get("first_ttft_ms")), s.get("first_cached_prompt_tokens"),
                        c, report._f(s.get("ttft_p50_ms")), s["ttft_bar_ms"],
                        s.get("cached_min"), s["cached_target"],
                        report._mib(s.get("per_request_bytes")),
                        report._mib(s.get("source_bytes"))))
        elif kind in ("context", "mixed"):
            what = "%.1f tok/s, TPOT p50 %s ms, p99 %s ms, gap p99 %s ms, TTFT p50 %s ms," % (
                s["tok_s"], report._f(s.get("tpot_p50_ms"), "%.2f"),
                report._f(s.get("tpot_p99_ms"), "%.2f"), report._f(s.get("gap_p99_ms"), "%.2f"),
                report._f(s.get("ttft_p50_ms"), "%.1f"))
        else:
            what = "%sTTFT p50 %s ms," % (
                "%.1f tok/s, TPOT p50 %s ms, " % (s["tok_s"], report._f(s["tpot_p50_ms"], "%.2f"))
                if decode else "", report._f(s["ttft_p50_ms"], "%.1f"))
        log("  %d done, errors %s, %s client CPU %.0f%%, %.1f s" % (
            s["done"], s["errors"] or 0, what, s["client_cpu_pct"] or 0, s["wall_s"]))
        write_results(args, result)
    return api


def main(argv):
    args = parse_args(argv)
    t_start = time.monotonic()
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    result = {"meta": {"mode": args.mode, "device": ",".join(args.devices), "argv": argv,
                       "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                       "host_cpus": os.cpu_count(), "k": args.k},
              "config": {k: v for k, v in vars(args).items()},
              "rows": [], "skipped": [], "restarts": []}
    servers = []
    ok = False
    try:
        make_model(args, result)
        if args.checkpoint_only:
            log("checkpoint ready in %s (--checkpoint-only)" % args.model)
        else:
            run_cuda_bench(args, result)
            api = run_rows(args, result, t_start, servers)
            api.close()
        ok = True
    finally:
        for s in reversed(servers):
            s.stop()
        for name in ("worker", "scheduler"):  # log tails come back with the results
            mine = [x for x in servers if x.name == name]
            if mine:
                with open(os.path.join(args.out, name + ".log"), "w") as f:
                    for x in mine:  # every incarnation, in one file
                        f.write(tail(x.log_path, LOG_TAIL_BYTES // len(mine)))
        result["meta"]["seconds"] = time.monotonic() - t_start
        result["meta"]["ok"] = ok
        text = write_results(args, result)
    if args.checkpoint_only:
        return 0
    print(text)
    errors = sum(sum(r["errors"].values()) for r in result["rows"])
    rows_ok = len(result["rows"]) == len(plan(args)) and not result["skipped"]
    log("done in %.0f s: %d rows, %d errors%s; wrote %s" % (
        result["meta"]["seconds"], len(result["rows"]), errors,
        "" if rows_ok else ", %d rows skipped" % len(result["skipped"]),
        os.path.join(args.out, "serve_bench.{json,txt}")))
    return 0 if (errors == 0 and rows_ok) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
