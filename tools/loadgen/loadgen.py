#!/usr/bin/env python3
"""loadgen: drives a specserve scheduler (Generate) or a worker directly (Admit +
Burst + Release) with concurrent requests and reports latency percentiles.

    tools/loadgen/loadgen.py --address 127.0.0.1:50051 --concurrency 4 \\
        --requests 64 --max-tokens 64 [--spec --k 3] [--json out.json]
    tools/loadgen/loadgen.py --direct-worker 127.0.0.1:50061 --address ...
    tools/loadgen/loadgen.py --address SCHED --direct-worker WORKER \\
        --compare-direct --concurrency 1 --requests 40

Modes:
  scheduler (default)  one-shot Generate requests to --address (text input,
                       or --input ids to send pre-tokenized ids).
  --direct-worker ADDR without --compare-direct: only the worker, the way the
                       scheduler drives it for a one-shot request: Admit
                       (empty history), Bursts of --burst-tokens (the first
                       carries the prompt as its suffix, the rest continue)
                       until max-tokens or a stop, then Release. Prompts are
                       tokenized by the scheduler's Tokenize RPC when --address
                       is given, else with the `tokenizers` package and
                       --tokenizer.
  --compare-direct     both, side by side in one run: the same prompts, the
                       modes alternating request by request, and the
                       scheduler's added median latency per burst
                       (median per-burst time through the scheduler minus
                       direct; per-burst time = e2e latency / bursts).

Only gRPC reflection is used (tools/rpc/reflection_client.py): no generated
code, no .proto files. Output: a progress bar on stderr; per mode a table of
TTFT, inter-token latency (gap between token-bearing messages / tokens in
the message), TPOT ((e2e - TTFT) / (tokens - 1)), e2e latency, time per
burst and burst boundary gap at p50/p90/p99, output tokens/s, requests/s and errors by status code;
--json OUT writes the same figures plus every request's record.

Keep --burst-tokens equal to the scheduler's --burst_tokens (default 32) so
that both paths run the same bursts.
"""
import argparse
import itertools
import json
import math
import os
import sys
import threading
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tools", "rpc"))

import grpc  # noqa: E402
from reflection_client import ReflectionClient  # noqa: E402

BUILTIN_PROMPTS = [
    'import argparse\nimport json\n\n\ndef parse_args():\n'
    '    parser = argparse.ArgumentParser(description="Convert CSV to JSON.")\n',
    'class LRUCache:\n    """A least-recently-used cache."""\n\n'
    '    def __init__(self, capacity):\n',
    'def read_config(path):\n    with open(path) as f:\n',
    'import unittest\n\n\nclass TestSort(unittest.TestCase):\n'
    '    def test_empty_list(self):\n',
    'def merge_sort(items):\n    if len(items) <= 1:\n        return items\n',
    'import os\n\n\ndef walk_files(root, suffix=".py"):\n',
    'class Person:\n    def __init__(self, name, age):\n'
    '        self._name = name\n\n    @property\n    def name(self):\n',
    'from collections import defaultdict\n\n\ndef group_by(key, items):\n',
]

SCHEDULER, DIRECT = "scheduler", "direct"


def percentile(xs, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def median(xs):
    return percentile(xs, 50)


class Record:
    """One request: times are seconds from its start (perf_counter based)."""

    def __init__(self, mode, prompt_index, prompt_tokens):
        self.mode = mode
        self.prompt_index = prompt_index
        self.prompt_tokens = prompt_tokens
        self.start = 0.0
        self.ttft = None
        self.chunks = []  # (seconds since start, tokens in the message)
        self.e2e = None
        self.tokens = 0
        self.bursts = None  # counted (direct) or filled in later (scheduler)
        self.bursts_estimated = False
        self.status = "OK"
        self.error = ""
        self.finish = ""
        self.spec = None  # {"rounds", "drafted", "accepted"}
        # Token index at which each burst after the first starts (direct:
        # counted; scheduler: that of the direct run of the same prompt).
        self.burst_starts = None

    def add_chunk(self, t, n):
        if n <= 0:
            return
        if self.ttft is None:
            self.ttft = t
        self.chunks.append((t, n))
        self.tokens += n

    def itl(self):
        """Per-token latency of every message after the first."""
        return [(b[0] - a[0]) / b[1] for a, b in zip(self.chunks, self.chunks[1:])]

    def tpot(self):
        if self.tokens < 2 or self.e2e is None or self.ttft is None:
            return None
        return (self.e2e - self.ttft) / (self.tokens - 1)

    def burst_gaps(self):
        """At each burst boundary, the time from the message with the last
        token of one burst to the message with the first token of the next:
        the cost of dispatching a burst. Boundaries inside a message are
        skipped."""
        if not self.burst_starts:
            return []
        starts, gaps, before = set(self.burst_starts), [], 0
        for i, (t, n) in enumerate(self.chunks):
            if i > 0 and before in starts:
                gaps.append(t - self.chunks[i - 1][0])
            before += n
        return gaps

    def per_burst(self):
        if not self.bursts or self.e2e is None:
            return None
        return self.e2e / self.bursts

    def to_json(self):
        return {
            "mode": self.mode, "prompt_index": self.prompt_index,
            "prompt_tokens": self.prompt_tokens, "status": self.status,
            "error": self.error, "finish": self.finish,
            "start_s": self.start, "ttft_s": self.ttft, "e2e_s": self.e2e,
            "tokens": self.tokens, "bursts": self.bursts,
            "burst_starts": self.burst_starts,
            "burst_gaps_s": self.burst_gaps(),
            "bursts_estimated": self.bursts_estimated, "tpot_s": self.tpot(),
            "spec": self.spec,
        }


class Target:
    """A gRPC server known through reflection; method callables cached."""

    def __init__(self, address):
        self.address = address
        self.client = ReflectionClient(address)
        self._lock = threading.Lock()
        self._methods = {}

    def method(self, full_method):
        with self._lock:
            if full_method not in self._methods:
                m = self.client.method(full_method)
                req = self.client.message_class(m.input_type)
                resp = self.client.message_class(m.output_type)
                kind = (self.client.channel.unary_stream if m.server_streaming
                        else self.client.channel.unary_unary)
                call = kind("/" + full_method,
                            request_serializer=req.SerializeToString,
                            response_deserializer=resp.FromString)
                self._methods[full_method] = (req, call)
            return self._methods[full_method]

    def call(self, full_method, timeout=None, **fields):
        req_cls, call = self.method(full_method)
        return call(req_cls(**fields), timeout=timeout)

    def close(self):
        self.client.close()


class SchedulerTarget(Target):
    def tokenize(self, text):
        return list(self.call("specserve.v1.Tokenization/Tokenize",
                              timeout=30, text=text, parse_special=True).ids)

    def run(self, args, prompt_text, prompt_ids, rec):
        fields = dict(
            sampling={"temperature": args.temperature, "seed": args.seed},
            stopping={"max_tokens": args.max_tokens,
                      "ignore_eos": args.ignore_eos},
            speculation={"enable": args.spec, "k": args.k},
            response={"ids": True, "text": True, "spec_stats": True})
        if args.input == "ids":
            fields["token_ids"] = {"ids": prompt_ids}
        else:
            fields["text"] = prompt_text
        t0 = time.perf_counter()
        for ev in self.call("specserve.v1.Generation/Generate",
                            timeout=args.timeout, **fields):
            now = time.perf_counter() - t0
            kind = ev.WhichOneof("event")
            if kind == "delta":
                rec.add_chunk(now, len(ev.delta.ids))
            elif kind == "final":
                f = getattr(ev, "final")
                rec.finish = f.DESCRIPTOR.fields_by_name[
                    "finish_reason"].enum_type.values_by_number[
                        f.finish_reason].name
                s = f.spec_stats
                rec.spec = {"rounds": s.rounds, "drafted": s.drafted,
                            "accepted": s.accepted}
        rec.e2e = time.perf_counter() - t0


class DirectTarget(Target):
    """Drives a worker as the scheduler does for a one-shot request."""

    def __init__(self, address):
        super().__init__(address)
        info = self.call("specserve.worker.v1.Worker/GetWorkerInfo", timeout=30)
        self.eos = list(info.model.eos_token_ids)
        self.max_context = info.model.max_context
        self._ids = itertools.count()

    def run(self, args, prompt_text, prompt_ids, rec):
        k = (args.k or 3) if args.spec else 0
        sid = "loadgen-%d-%d" % (os.getpid(), next(self._ids))
        capacity = min(self.max_context, len(prompt_ids) + args.max_tokens + k + 10)
        stop = [] if args.ignore_eos else self.eos
        t0 = time.perf_counter()
        self.call("specserve.worker.v1.Worker/Admit", timeout=args.timeout,
                  session_id=sid, capacity=capacity, history=[],
                  speculative=True)
        try:
            produced, bursts = 0, 0
            rec.burst_starts = []
            spec = {"rounds": 0, "drafted": 0, "accepted": 0}
            while True:
                want = min(args.burst_tokens, args.max_tokens - produced)
                if bursts > 0:
                    rec.burst_starts.append(produced)
                summary = None
                for ev in self.call(
                        "specserve.worker.v1.Worker/Burst", timeout=args.timeout,
                        session_id=sid, suffix=prompt_ids if bursts == 0 else [],
                        max_new=want, k=k, stop_token_ids=stop,
                        sampling={"temperature": args.temperature,
                                  "seed": args.seed}):
                    if ev.WhichOneof("event") == "tokens":
                        n = len(ev.tokens.ids)
                        rec.add_chunk(time.perf_counter() - t0, n)
                        produced += n
                    else:
                        summary = ev.summary
                bursts += 1
                if summary is None:
                    raise RuntimeError("burst stream ended without a summary")
                t = summary.telemetry_delta
                spec["rounds"] += t.rounds
                spec["drafted"] += t.drafted
                spec["accepted"] += t.accepted
                end = summary.DESCRIPTOR.fields_by_name["end"].enum_type \
                    .values_by_number[summary.end].name
                if end != "MAX_NEW":
                    rec.finish = {"STOP_TOKEN": "STOP", "CAPACITY": "CONTEXT_FULL",
                                  "CANCELLED": "CANCELLED"}.get(end, end)
                    break
                if produced >= args.max_tokens:
                    rec.finish = "LENGTH"
                    break
            rec.bursts = bursts
            rec.spec = spec
        finally:
            try:
                self.call("specserve.worker.v1.Worker/Release", timeout=30,
                          session_id=sid)
            except grpc.RpcError:
                pass
        rec.e2e = time.perf_counter() - t0


class Progress:
    """A one-line progress bar on stderr (a line per 10% when not a tty)."""

    def __init__(self, total, duration, enabled):
        self.total, self.duration = total, duration
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.done = self.errors = 0
        self.t0 = time.monotonic()
        self._last_decile = -1
        self._lock = threading.Lock()

    def update(self, ok):
        with self._lock:
            self.done += 1
            self.errors += 0 if ok else 1
            self._draw()

    def _draw(self, final=False):
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.t0
        if self.total:
            frac = self.done / self.total
        else:
            frac = min(1.0, elapsed / self.duration) if self.duration else 0
        if not self.tty:
            decile = int(frac * 10)
            if decile == self._last_decile:
                return
            self._last_decile = decile
        width = 30
        bar = "#" * int(frac * width) + "." * (width - int(frac * width))
        line = "[%s] %d%s requests, %d errors, %.1f s, %.2f req/s" % (
            bar, self.done, "/%d" % self.total if self.total else "",
            self.errors, elapsed, self.done / elapsed if elapsed > 0 else 0)
        if self.tty:
            sys.stderr.write("\r" + line + ("\n" if final else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def finish(self):
        with self._lock:
            self._draw(final=True)


def process_cpu_seconds(pid):
    """User + system CPU time of a local process (Linux /proc), or None."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def load_prompts(path):
    if not path:
        return list(BUILTIN_PROMPTS)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if data is None:
        lines = [l for l in text.splitlines() if l.strip()]
        try:  # JSON lines: one JSON string (or {"prompt": ...}) per line
            data = [json.loads(l) for l in lines]
        except ValueError:  # plain text: one prompt per line
            data = lines
    if not isinstance(data, list) or not data:
        raise SystemExit("loadgen: --prompts: expected a non-empty list")
    prompts = [d["prompt"] if isinstance(d, dict) else d for d in data]
    if not all(isinstance(p, str) and p for p in prompts):
        raise SystemExit("loadgen: --prompts: every prompt must be a string")
    return prompts


def tokenize_all(prompts, scheduler, tokenizer_path):
    if scheduler is not None:
        return [scheduler.tokenize(p) for p in prompts]
    try:
        import tokenizers
    except ImportError:
        raise SystemExit("loadgen: --direct-worker without --address needs the "
                         "`tokenizers` package (or give --address to use the "
                         "scheduler's Tokenize RPC)")
    tok = tokenizers.Tokenizer.from_file(tokenizer_path)
    return [tok.encode(p, add_special_tokens=False).ids for p in prompts]


def job_stream(modes, n_prompts, requests):
    """(mode, prompt index) pairs: each mode gets `requests` (None = no end);
    with two modes they alternate, swapping which goes first every pair."""
    for i in itertools.count():
        if requests is not None and i >= requests:
            return
        order = modes if i % 2 == 0 else list(reversed(modes))
        for m in order:
            yield m, i % n_prompts


def run_load(args, targets, prompts, prompt_ids, modes):
    requests = args.requests if (args.requests or not args.duration) else None
    jobs = job_stream(modes, len(prompts), requests)
    jobs_lock = threading.Lock()
    total = requests * len(modes) if requests is not None else 0
    progress = Progress(total, args.duration, not args.quiet)
    records, rec_lock = [], threading.Lock()
    t_start = time.perf_counter()
    deadline = t_start + args.duration if args.duration else None

    def worker():
        while True:
            if deadline is not None and time.perf_counter() >= deadline:
                return
            with jobs_lock:
                job = next(jobs, None)
            if job is None:
                return
            mode, p = job
            rec = Record(mode, p, len(prompt_ids[p]))
            rec.start = time.perf_counter() - t_start
            try:
                targets[mode].run(args, prompts[p], prompt_ids[p], rec)
            except grpc.RpcError as e:
                rec.status = e.code().name
                rec.error = e.details() or ""
            except Exception as e:  # a broken stream, a bad message
                rec.status = "CLIENT_ERROR"
                rec.error = repr(e)
            with rec_lock:
                records.append(rec)
            progress.update(rec.status == "OK")

    threads = [threading.Thread(target=worker, daemon=True)
               for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t_start
    progress.finish()
    return records, wall


def fill_scheduler_bursts(records, burst_tokens, max_tokens):
    """A scheduler request's burst count: that of the direct requests of the
    same prompt (greedy: the same tokens, so the same bursts), else the
    estimate ceil(min(tokens, max_tokens) / burst_tokens) (exact for plain
    decode; a speculative request's overshoot can, rarely, save a burst)."""
    direct, starts = {}, {}
    for r in records:
        if r.mode == DIRECT and r.status == "OK" and r.bursts:
            direct.setdefault(r.prompt_index, []).append(r.bursts)
            starts.setdefault(r.prompt_index, {}).setdefault(
                r.tokens, r.burst_starts)
    for r in records:
        if r.mode != SCHEDULER or r.status != "OK":
            continue
        # The same prompt and token count (greedy: the same tokens) was
        # split into bursts at the same places.
        r.burst_starts = starts.get(r.prompt_index, {}).get(r.tokens)
        if r.prompt_index in direct:
            r.bursts = int(round(median(direct[r.prompt_index])))
        else:
            # Overshoot past max_tokens does not take a burst of its own.
            n = min(r.tokens, max_tokens) if max_tokens > 0 else r.tokens
            r.bursts = max(1, math.ceil(n / burst_tokens))
            r.bursts_estimated = True


def ms(x):
    return None if x is None else x * 1e3


def summarize(records, wall):
    ok = [r for r in records if r.status == "OK"]
    errors = {}
    for r in records:
        if r.status != "OK":
            errors[r.status] = errors.get(r.status, 0) + 1

    def dist(values):
        values = [v for v in values if v is not None]
        return {"p50": ms(percentile(values, 50)), "p90": ms(percentile(values, 90)),
                "p99": ms(percentile(values, 99)),
                "mean": ms(sum(values) / len(values)) if values else None,
                "n": len(values)}

    tokens = sum(r.tokens for r in ok)
    rounds = sum(r.spec["rounds"] for r in ok if r.spec)
    accepted = sum(r.spec["accepted"] for r in ok if r.spec)
    return {
        "requests": len(records), "ok": len(ok), "errors": errors,
        "wall_s": wall, "output_tokens": tokens,
        "output_tokens_per_s": tokens / wall if wall > 0 else 0,
        "requests_per_s": len(ok) / wall if wall > 0 else 0,
        "ttft_ms": dist([r.ttft for r in ok]),
        "itl_ms": dist([x for r in ok for x in r.itl()]),
        "tpot_ms": dist([r.tpot() for r in ok]),
        "e2e_ms": dist([r.e2e for r in ok]),
        "per_burst_ms": dist([r.per_burst() for r in ok]),
        "burst_gap_ms": dist([g for r in ok for g in r.burst_gaps()]),
        "bursts_per_request": median([r.bursts for r in ok if r.bursts]),
        "spec_rounds": rounds,
        "spec_tokens_per_round": 1 + accepted / rounds if rounds else None,
    }


def compare(records):
    """The scheduler's added latency over the direct path, from requests run
    side by side: medians over all requests, and per prompt (paired)."""
    ok = [r for r in records if r.status == "OK"]
    by = {SCHEDULER: [r for r in ok if r.mode == SCHEDULER],
          DIRECT: [r for r in ok if r.mode == DIRECT]}

    def med(mode, f):
        return median([v for v in (f(r) for r in by[mode]) if v is not None])

    out = {}
    gaps = {m: [g for r in by[m] for g in r.burst_gaps()] for m in by}
    s, d = median(gaps[SCHEDULER]), median(gaps[DIRECT])
    out["burst_gap_ms"] = {
        "scheduler": ms(s), "direct": ms(d),
        "added": ms(s - d) if s is not None and d is not None else None}
    for key, f in (("ttft_ms", lambda r: r.ttft), ("e2e_ms", lambda r: r.e2e),
                   ("per_burst_ms", lambda r: r.per_burst()),
                   ("tpot_ms", lambda r: r.tpot())):
        s, d = med(SCHEDULER, f), med(DIRECT, f)
        out[key] = {"scheduler": ms(s), "direct": ms(d),
                    "added": ms(s - d) if s is not None and d is not None else None}
    # Paired by prompt: (median sched e2e - median direct e2e) / bursts.
    paired = []
    for p in sorted({r.prompt_index for r in ok}):
        s = [r.e2e for r in by[SCHEDULER] if r.prompt_index == p]
        d = [r for r in by[DIRECT] if r.prompt_index == p]
        if s and d:
            bursts = median([r.bursts for r in d])
            paired.append((median(s) - median([r.e2e for r in d])) / bursts)
    out["paired_added_per_burst_ms"] = ms(median(paired))
    out["paired_prompts"] = len(paired)
    same = 0
    for p in {r.prompt_index for r in ok}:
        st = {r.tokens for r in by[SCHEDULER] if r.prompt_index == p}
        dt = {r.tokens for r in by[DIRECT] if r.prompt_index == p}
        same += st == dt and len(st) == 1
    out["prompts_with_equal_token_counts"] = same
    return out


def fmt(x, width=9):
    return ("%*.2f" % (width, x)) if x is not None else "%*s" % (width, "-")


def print_summary(name, address, s, out):
    print("== %s (%s): %d ok, %d errors in %.2f s; %.2f req/s, %.1f output "
          "tokens/s" % (name, address, s["ok"], s["requests"] - s["ok"],
                        s["wall_s"], s["requests_per_s"],
                        s["output_tokens_per_s"]), file=out)
    print("%-30s %9s %9s %9s %9s %6s" % ("metric (ms)", "p50", "p90", "p99",
                                          "mean", "n"), file=out)
    for key, label in (("ttft_ms", "TTFT"),
                       ("itl_ms", "inter-token latency"),
                       ("tpot_ms", "TPOT"),
                       ("e2e_ms", "e2e latency"),
                       ("per_burst_ms", "time per burst (e2e/bursts)"),
                       ("burst_gap_ms", "burst boundary gap")):
        d = s[key]
        print("%-30s %s %s %s %s %6d" % (label, fmt(d["p50"]), fmt(d["p90"]),
                                         fmt(d["p99"]), fmt(d["mean"]), d["n"]),
              file=out)
    extra = "bursts per request (median): %s" % s["bursts_per_request"]
    if s["spec_tokens_per_round"]:
        extra += "; speculative rounds %d, %.2f tokens/round" % (
            s["spec_rounds"], s["spec_tokens_per_round"])
    print(extra, file=out)
    errs = ", ".join("%s %d" % kv for kv in sorted(s["errors"].items()))
    print("errors by status code: %s" % (errs or "none"), file=out)


def print_compare(c, out):
    print("== scheduler vs direct worker, side by side (medians, ms)", file=out)
    print("%-30s %10s %10s %10s" % ("", "scheduler", "direct", "added"),
          file=out)
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"),
                       ("e2e_ms", "e2e latency"),
                       ("per_burst_ms", "time per burst (e2e/bursts)"),
                       ("burst_gap_ms", "burst boundary gap")):
        d = c[key]
        print("%-30s %s %s %s" % (label, fmt(d["scheduler"], 10),
                                  fmt(d["direct"], 10), fmt(d["added"], 10)),
              file=out)
    print("scheduler added median latency per burst: %s ms (median per-burst "
          "time through the scheduler minus direct); paired by prompt: %s ms "
          "(median over %d prompts)" % (
              fmt(c["per_burst_ms"]["added"], 0).strip(),
              fmt(c["paired_added_per_burst_ms"], 0).strip(),
              c["paired_prompts"]), file=out)
    print("at each burst boundary (last token of a burst to the first of the "
          "next) the scheduler adds %s ms (median)" % (
              fmt(c["burst_gap_ms"]["added"], 0).strip()), file=out)


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--address", help="scheduler HOST:PORT")
    ap.add_argument("--direct-worker", metavar="ADDRESS",
                    help="drive this worker's Burst RPC directly")
    ap.add_argument("--compare-direct", action="store_true",
                    help="run scheduler and direct side by side "
                         "(needs --address and --direct-worker)")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--requests", type=int, default=0,
                    help="requests per mode (default 16, or no limit with "
                         "--duration)")
    ap.add_argument("--duration", type=float, default=0,
                    help="stop issuing requests after this many seconds")
    ap.add_argument("--prompts", help="JSON list / JSON lines / one per line")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--spec", action="store_true",
                    help="request speculative decoding")
    ap.add_argument("--k", type=int, default=0,
                    help="draft depth (implies --spec; 0 = server default, "
                         "3 in direct mode)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ignore-eos", action="store_true",
                    help="keep generating past EOS (fixed-length requests)")
    ap.add_argument("--input", choices=("text", "ids"), default="text",
                    help="what the scheduler gets: text, or pre-tokenized ids")
    ap.add_argument("--burst-tokens", type=int, default=32,
                    help="direct mode's tokens per burst; keep equal to the "
                         "scheduler's --burst_tokens")
    ap.add_argument("--warmup", type=int, default=1,
                    help="unrecorded requests per mode first")
    ap.add_argument("--timeout", type=float, default=120,
                    help="deadline of each RPC (s)")
    ap.add_argument("--tokenizer",
                    default=os.path.join(REPO, "models", "default",
                                         "tokenizer.json"),
                    help="tokenizer.json for --direct-worker without --address")
    ap.add_argument("--cpu-pid", type=int, action="append", default=[],
                    metavar="PID",
                    help="a local server process (repeatable): report the "
                         "CPU time it used during the run, per request")
    ap.add_argument("--json", metavar="OUT", help="write the results here")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if args.k:
        args.spec = True
    if not args.address and not args.direct_worker:
        ap.error("give --address (scheduler) and/or --direct-worker")
    if args.compare_direct and not (args.address and args.direct_worker):
        ap.error("--compare-direct needs --address and --direct-worker")
    if args.direct_worker and args.max_tokens <= 0:
        ap.error("direct mode needs --max-tokens > 0")
    if args.concurrency < 1 or args.requests < 0 or args.burst_tokens < 1:
        ap.error("--concurrency and --burst-tokens must be >= 1, "
                 "--requests >= 0")
    if not args.requests and not args.duration:
        args.requests = 16
    return args


def main(argv):
    args = parse_args(argv)
    prompts = load_prompts(args.prompts)
    if args.compare_direct:
        modes = [SCHEDULER, DIRECT]
    elif args.direct_worker:
        modes = [DIRECT]
    else:
        modes = [SCHEDULER]
    targets = {}
    try:
        scheduler = SchedulerTarget(args.address) if args.address else None
        if SCHEDULER in modes:
            targets[SCHEDULER] = scheduler
        if DIRECT in modes:
            targets[DIRECT] = DirectTarget(args.direct_worker)
        prompt_ids = tokenize_all(prompts, scheduler, args.tokenizer)
    except grpc.RpcError as e:
        print("loadgen: setup failed: %s: %s" % (e.code().name, e.details()),
              file=sys.stderr)
        return 1
    # Warm-up: first calls pay for reflection, connections and caches.
    for mode in modes:
        for i in range(args.warmup):
            rec = Record(mode, i % len(prompts), 0)
            try:
                targets[mode].run(args, prompts[i % len(prompts)],
                                  prompt_ids[i % len(prompts)], rec)
            except grpc.RpcError as e:
                print("loadgen: warm-up %s request failed: %s: %s" % (
                    mode, e.code().name, e.details()), file=sys.stderr)

    cpu_before = {pid: process_cpu_seconds(pid) for pid in args.cpu_pid}
    records, wall = run_load(args, targets, prompts, prompt_ids, modes)
    cpu = {}
    for pid, before in cpu_before.items():
        after = process_cpu_seconds(pid)
        if before is not None and after is not None:
            cpu[str(pid)] = {"cpu_s": after - before,
                             "cpu_ms_per_request": 1e3 * (after - before)
                             / max(1, len(records))}
    fill_scheduler_bursts(records, args.burst_tokens, args.max_tokens)
    result = {
        "config": {k: v for k, v in vars(args).items()},
        "prompts": len(prompts),
        "modes": {},
        "requests": [r.to_json() for r in records],
    }
    for mode in modes:
        s = summarize([r for r in records if r.mode == mode], wall)
        result["modes"][mode] = s
        print_summary(mode, args.address if mode == SCHEDULER
                      else args.direct_worker, s, sys.stdout)
        print(file=sys.stdout)
    if args.compare_direct:
        result["compare"] = compare(records)
        print_compare(result["compare"], sys.stdout)
    if cpu:
        result["cpu"] = cpu
        n_sched = sum(r.mode == SCHEDULER for r in records)
        for pid, c in cpu.items():
            line = "process %s used %.3f s of CPU: %.2f ms per request (%d)" % (
                pid, c["cpu_s"], c["cpu_ms_per_request"], len(records))
            if args.compare_direct and n_sched:
                c["cpu_ms_per_scheduler_request"] = 1e3 * c["cpu_s"] / n_sched
                line += ", %.2f ms per scheduler request (%d)" % (
                    c["cpu_ms_per_scheduler_request"], n_sched)
            print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    for t in targets.values():
        t.close()
    return 0 if any(r.status == "OK" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
