"""The load of serve_bench: closed-loop clients sending Generate over gRPC,
all in one process on one asyncio loop (grpc.aio: one stream per request in
flight, on one HTTP/2 connection), and the statistics of a row.

A row is `c` clients, each sending `n` requests one after the other (the next
as soon as the last one's stream ended), all requests alike: c streams are in
flight at every moment but the last request's tail. The row's wall time runs
from the first request's start to the last one's end.

Whether the client kept up is measured, not assumed: the process's CPU time
over the row (all its threads: grpc's included) and the lateness of a 5 ms
ticker on the loop (a loop busy with messages runs it late).
"""
import asyncio
import json
import math
import os
import random
import time

import grpc

GENERATE = "specserve.v1.Generation/Generate"
# Above either, a row is flagged as possibly limited by the client.
CLIENT_CPU_LIMIT_PCT = 70.0
LOOP_LAG_LIMIT_MS = 10.0


def percentile(xs, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def run_timed(client, coro, hard_s, pids):
    """Runs `coro` (a row's measurement on `client`) on a fresh event loop,
    cut after hard_s seconds (None: no cut; what was still running is then
    recorded as CUT by the requests themselves), then closes the client.
    Returns (coro's result or None if cut, the row's start on
    time.perf_counter(), CPU seconds of each named process in `pids` over it)."""
    loop = asyncio.new_event_loop()
    cpu0 = {name: proc_cpu_seconds(pid) for name, pid in (pids or {}).items()}
    t_row = time.perf_counter()
    raw = None
    try:
        raw = loop.run_until_complete(asyncio.wait_for(coro, timeout=hard_s))
    except asyncio.TimeoutError:
        pass
    finally:
        loop.run_until_complete(client.close())
        loop.close()
    cpu = {}
    for name, pid in (pids or {}).items():
        after = proc_cpu_seconds(pid)
        if after is not None and cpu0.get(name) is not None:
            cpu[name] = after - cpu0[name]
    return raw, t_row, cpu


def proc_cpu_seconds(pid):
    """User + system CPU seconds of a local process (all threads), or None."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class Record:
    __slots__ = ("start", "ttft", "end", "tokens", "messages", "status",
                 "error", "finish", "completion_tokens", "prompt_tokens",
                 "cached_prompt_tokens", "rounds", "drafted", "accepted", "demoted")

    def __init__(self):
        self.start = self.ttft = self.end = None
        self.tokens = self.messages = 0
        self.status, self.error, self.finish = "OK", "", ""
        # From the final event's usage (None without one).
        self.completion_tokens = self.prompt_tokens = self.cached_prompt_tokens = None
        self.rounds = self.drafted = self.accepted = 0
        self.demoted = False

    def e2e(self):
        return None if self.end is None else self.end - self.start

    def tpot(self):
        """(e2e - TTFT) / (tokens - 1): the time per output token after the
        first, as the client saw it."""
        if self.status != "OK" or self.tokens < 2 or self.ttft is None:
            return None
        return (self.e2e() - self.ttft) / (self.tokens - 1)

    def to_json(self):
        return {"start_s": self.start, "ttft_s": self.ttft, "e2e_s": self.e2e(),
                "tokens": self.tokens, "messages": self.messages,
                "status": self.status, "error": self.error[:200],
                "finish": self.finish, "completion_tokens": self.completion_tokens,
                "prompt_tokens": self.prompt_tokens,
                "cached_prompt_tokens": self.cached_prompt_tokens,
                "spec": {"rounds": self.rounds, "drafted": self.drafted,
                         "accepted": self.accepted, "demoted": self.demoted}}


class LoadClient:
    """Generate requests from one process. `api` is a reflect.ServerApi of the
    scheduler (its message classes)."""

    def __init__(self, api, address, timeout_s=600.0, max_consecutive_errors=3):
        self.api = api
        self.address = address
        self.timeout_s = timeout_s
        self.max_consecutive_errors = max_consecutive_errors
        self.req_cls, self.ev_cls, _ = api.method(GENERATE)
        final = self.ev_cls.DESCRIPTOR.fields_by_name["final"].message_type
        self._finish_names = {v.number: v.name for v in
                              final.fields_by_name["finish_reason"].enum_type.values}
        self._channel = None
        self._generate = None

    def request(self, ids, max_tokens, spec, k, json_schema=None):
        """A greedy request; with json_schema (a JSON text), its output is
        constrained to the schema (structured output: under a grammar the
        output also stops where the schema's value is complete)."""
        extra = {}
        if json_schema is not None:
            extra["structured_output"] = {"json_schema": json_schema}
        return self.req_cls(
            token_ids={"ids": ids},
            sampling={"temperature": 0.0},
            stopping={"max_tokens": max_tokens, "ignore_eos": True},
            speculation={"enable": bool(spec), "k": k if spec else 0},
            response={"ids": True, "text": False, "spec_stats": True}, **extra)

    async def open(self):
        """Opens the channel (once; close() ends it)."""
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(
                self.address, options=[("grpc.max_receive_message_length", 64 << 20),
                                       ("grpc.max_send_message_length", 64 << 20)])
            self._generate = self.api.callable(self._channel, GENERATE)

    async def close(self):
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def one(self, req, sink, on_ids=None):
        """Sends `req`, reads its stream; the record goes to `sink`, also
        when the row's hard deadline cancels the request (status CUT).
        on_ids(t, n), when given, is called for every delta that carries n > 0
        ids, with t its arrival time (time.perf_counter, the clock of the
        record's start and TTFT)."""
        rec = Record()
        clock = time.perf_counter
        rec.start = t0 = clock()
        call = None
        try:
            call = self._generate(req, timeout=self.timeout_s)
            async for ev in call:
                kind = ev.WhichOneof("event")
                if kind == "delta":
                    n = len(ev.delta.ids)
                    if n:
                        t = clock()
                        if rec.ttft is None:
                            rec.ttft = t - t0
                        rec.tokens += n
                        rec.messages += 1
                        if on_ids is not None:
                            on_ids(t, n)
                elif kind == "final":
                    f = ev.final
                    rec.finish = self._finish_names.get(f.finish_reason, str(f.finish_reason))
                    rec.completion_tokens = f.usage.completion_tokens
                    rec.prompt_tokens = f.usage.prompt_tokens
                    rec.cached_prompt_tokens = f.usage.cached_prompt_tokens
                    s = f.spec_stats
                    rec.rounds, rec.drafted, rec.accepted = s.rounds, s.drafted, s.accepted
                    rec.demoted = s.demoted
        except grpc.aio.AioRpcError as e:
            rec.status = e.code().name
            rec.error = e.details() or ""
        except asyncio.CancelledError:
            rec.status = "CUT"
            if call is not None:
                call.cancel()
            raise
        except Exception as e:  # a broken stream, a bad message
            rec.status = "CLIENT_ERROR"
            rec.error = repr(e)
        finally:
            rec.end = clock()
            sink.append(rec)
        return rec

    async def run(self, requests, soft_s=None, hard_s=None):
        """requests[i]: the list client i sends in turn; none is started
        after soft_s seconds, and those still running at hard_s are cancelled
        (recorded as CUT). Returns (records, measurements)."""
        await self.open()
        records = []

        async def client(reqs):
            failed = 0
            for r in reqs:
                if soft_s is not None and time.perf_counter() - t0 > soft_s:
                    break
                rec = await self.one(r, records)
                failed = failed + 1 if rec.status != "OK" else 0
                if failed >= self.max_consecutive_errors:
                    break  # the server refuses: the rest would fail alike

        lag = LoopLag()
        cpu0, t0 = time.process_time(), time.perf_counter()
        everyone = asyncio.gather(*(client(r) for r in requests))
        try:
            await asyncio.wait_for(everyone, timeout=hard_s)
        except asyncio.TimeoutError:
            pass  # cancelled: the running requests were recorded as CUT
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        lags = await lag.stop()
        for r in records:  # times from the row's start
            r.end -= t0
            r.start -= t0
        return records, dict(wall_s=wall, client_cpu_s=cpu, **lags)


class LoopLag:
    """How late a 5 ms ticker on the running loop wakes, from construction
    to stop(): a loop busy with messages runs it late, and so delays every
    arrival time it records by as much."""

    PERIOD_S = 0.005

    def __init__(self):
        self._lags = []
        self._stop = asyncio.Event()
        self._task = asyncio.ensure_future(self._tick())

    async def _tick(self):
        while not self._stop.is_set():
            t = time.perf_counter()
            await asyncio.sleep(self.PERIOD_S)
            self._lags.append(time.perf_counter() - t - self.PERIOD_S)

    async def stop(self):
        """{loop_lag_p99_ms, loop_lag_max_ms}."""
        self._stop.set()
        await self._task
        return {"loop_lag_p99_ms": 1e3 * (percentile(self._lags, 99) or 0.0),
                "loop_lag_max_ms": 1e3 * max(self._lags or [0.0])}


def cancel_running(streams):
    """Cancels the streams still running at a row's planned end; returns their
    indices (cancelled by the row, not errors). Each stream has a `task`."""
    cancelled = []
    for i, s in enumerate(streams):
        if not s.task.done():
            s.task.cancel()
            cancelled.append(i)
    return cancelled


async def reap_streams(streams):
    """No stream task outlives its row, also when the time budget cancels the
    row's coroutine (a stream still running is then recorded as CUT)."""
    for s in streams:
        if s.task is not None and not s.task.done():
            s.task.cancel()
    await asyncio.gather(*(s.task for s in streams if s.task is not None),
                         return_exceptions=True)


def random_prompts(rng, count, length, vocab):
    """`count` prompts of `length` token ids drawn uniformly from the
    vocabulary (any id is a valid input; no two prompts share a prefix)."""
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(count)]


def count_statuses(records, planned=()):
    """requests, done, cut, errors (by status) and error_examples of
    `records`; a record whose id() is in `planned` (a cancel the row made
    on purpose) counts as done, not as cut."""
    errors, cut, done = {}, 0, 0
    for r in records:
        if r.status == "OK" or id(r) in planned:
            done += 1
        elif r.status == "CUT":
            cut += 1
        else:
            errors[r.status] = errors.get(r.status, 0) + 1
    return {"requests": len(records), "done": done, "cut": cut, "errors": errors,
            "error_examples": sorted({"%s: %s" % (r.status, r.error[:160]) for r in records
                                      if r.status not in ("OK", "CUT")})[:5]}


def client_figures(m, done):
    """The client's share of a row from run()-style measurements `m`
    (wall_s, client_cpu_s, loop lags), and whether it may have limited the
    row (as summarize() flags it)."""
    wall = m["wall_s"]
    out = {"wall_s": wall, "client_cpu_s": m["client_cpu_s"],
           "client_cpu_pct": 100.0 * m["client_cpu_s"] / wall if wall > 0 else None,
           "loop_lag_p99_ms": m["loop_lag_p99_ms"], "loop_lag_max_ms": m["loop_lag_max_ms"]}
    out["client_limited"] = bool(done and wall >= 1.0 and (
        (out["client_cpu_pct"] or 0) > CLIENT_CPU_LIMIT_PCT or
        out["loop_lag_p99_ms"] > LOOP_LAG_LIMIT_MS))
    return out


def summarize(records, m, cpu=None):
    """The row's figures from its records and measurements."""
    ok = [r for r in records if r.status == "OK"]
    cut = [r for r in records if r.status == "CUT"]
    errors = {}
    for r in records:
        if r.status not in ("OK", "CUT"):
            errors[r.status] = errors.get(r.status, 0) + 1
    wall = m["wall_s"]
    # Every token received in the wall time counts toward tok/s, also those
    # of requests the hard deadline cut.
    tokens = sum(r.tokens for r in ok + cut)

    def ms(q, xs):
        v = percentile(xs, q)
        return None if v is None else 1e3 * v

    tpot = [r.tpot() for r in ok]
    ttft = [r.ttft for r in ok]
    e2e = [r.e2e() for r in ok]
    drafted = sum(r.drafted for r in ok)
    rounds = sum(r.rounds for r in ok)
    accepted = sum(r.accepted for r in ok)
    out = {
        "requests": len(records), "done": len(ok), "cut": len(cut), "errors": errors,
        "error_examples": sorted({"%s: %s" % (r.status, r.error[:160])
                                  for r in records if r.status not in ("OK", "CUT")})[:5],
        "wall_s": wall, "output_tokens": tokens,
        "tok_s": tokens / wall if wall > 0 else 0.0,
        "tpot_p50_ms": ms(50, tpot), "tpot_p99_ms": ms(99, tpot),
        "ttft_p50_ms": ms(50, ttft), "ttft_p99_ms": ms(99, ttft),
        "e2e_p50_ms": ms(50, e2e), "e2e_p99_ms": ms(99, e2e),
        "tokens_per_request": (tokens / len(ok)) if ok else None,
        "messages_per_request": (sum(r.messages for r in ok) / len(ok)) if ok else None,
        "finish": sorted({r.finish for r in ok}),
        "spec_rounds": rounds, "spec_drafted": drafted, "spec_accepted": accepted,
        "acceptance": accepted / drafted if drafted else None,
        "tokens_per_round": (rounds + accepted) / rounds if rounds else None,
        "demoted_requests": sum(1 for r in ok if r.demoted),
        "client_cpu_s": m["client_cpu_s"],
        "client_cpu_pct": 100.0 * m["client_cpu_s"] / wall if wall > 0 else None,
        "loop_lag_p99_ms": m["loop_lag_p99_ms"],
        "loop_lag_max_ms": m["loop_lag_max_ms"],
    }
    # The client kept up when it used well under one core and its loop ran a
    # 5 ms ticker on time (both thresholds: far from where a saturated loop
    # sits, 100% and tens of ms).
    # (A row that failed at once says nothing either way: its CPU share is
    # of a wall time of milliseconds.)
    out["client_limited"] = bool(ok and wall >= 1.0 and (
        (out["client_cpu_pct"] or 0) > CLIENT_CPU_LIMIT_PCT or
        out["loop_lag_p99_ms"] > LOOP_LAG_LIMIT_MS))
    if cpu:
        for name, secs in cpu.items():
            out["%s_cpu_pct" % name] = 100.0 * secs / wall if wall > 0 else None
    return out


# The schema of the structured-output rows: free strings, so that a
# random-weight model's output runs to max_tokens rather than closing the
# object after a few tokens.
JSON_ROW_SCHEMA = json.dumps({
    "type": "object",
    "properties": {"title": {"type": "string"},
                   "tags": {"type": "array", "items": {"type": "string"}},
                   "body": {"type": "string"}},
    "required": ["title", "tags", "body"]})


def run_row(client, *, concurrency, prompt_tokens, max_tokens, spec, k, vocab,
            target_s, min_requests, max_requests, seed, pids=None,
            fixed_requests=None, hard_s=None, json_schema=None):
    """One row: a warm-up round (one request per client, unrecorded: it also
    records the step shapes of this batch size), then n requests per client
    with n = target_s / the warm-up's wall time (clamped), or fixed_requests.
    No request starts after 2 * target_s (when n was sized); whatever runs
    hard_s seconds after the row's start is cut. Returns the summary dict
    (plus "records")."""
    rng = random.Random(seed)
    c = concurrency

    def batch(n):
        return [[client.request(p, max_tokens, spec, k, json_schema) for p in
                 random_prompts(rng, n, prompt_tokens, vocab)] for _ in range(c)]

    loop = asyncio.new_event_loop()
    t_row = time.monotonic()
    try:
        warm_records, warm = loop.run_until_complete(client.run(batch(1), hard_s=hard_s))
        if fixed_requests:
            n, soft = fixed_requests, None
        else:
            n = math.ceil(target_s / max(warm["wall_s"], 1e-3))
            n, soft = max(min_requests, min(max_requests, n)), 2.0 * target_s
        reqs = batch(n)
        left = None if hard_s is None else max(0.0, hard_s - (time.monotonic() - t_row))
        cpu0 = {name: proc_cpu_seconds(pid) for name, pid in (pids or {}).items()}
        records, m = loop.run_until_complete(client.run(reqs, soft_s=soft, hard_s=left))
        cpu = {}
        for name, pid in (pids or {}).items():
            after = proc_cpu_seconds(pid)
            if after is not None and cpu0.get(name) is not None:
                cpu[name] = after - cpu0[name]
        loop.run_until_complete(client.close())
    finally:
        loop.close()
    s = summarize(records, m, cpu)
    s.update(concurrency=c, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
             spec=bool(spec), k=k if spec else 0, requests_per_client=n,
             json_schema=json_schema is not None,
             warmup_wall_s=warm["wall_s"],
             warmup_errors=sum(r.status not in ("OK", "CUT") for r in warm_records),
             warmup_cut=sum(r.status == "CUT" for r in warm_records))
    s["records"] = [r.to_json() for r in records]
    return s
