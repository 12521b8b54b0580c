"""serve_bench's shared-prefix row: N concurrent requests that share one
P-token prefix, after one request that brought it (automatic prefix reuse,
docs/DESIGN.md "Prefix reuse"). The acceptance (issue: automatic prefix reuse,
point 3): 32 concurrent requests sharing one 8k-token prefix: TTFT p50 <=
0.2 s after the first, and device memory for the prefix held once.

One row per (P, first-request variant), on one LoadClient (one asyncio loop,
one channel), every request greedy, ignore_eos, speculation off:
  0. prompts: a fresh random P-token prefix and N + 1 distinct random
     S-token suffixes (seeded per row, as load.py draws them), so that no
     earlier row's cached session holds any of them.
  1. before: the worker's memory figures, settled (below).
  2. first: one request alone, max_tokens FIRST_MAX_TOKENS. Its prompt is
       suffix   the prefix + its own suffix (the acceptance's scenario: the
                first client's request carries its own turn too), or
       prefix   the prefix alone (a client that primes the cache with
                exactly the shared prefix).
     Its TTFT and usage.cached_prompt_tokens (expected 0) are recorded. The
     scheduler parks a one-shot request's session as a cache-owned
     checkpoint and indexes it before it sends the final event
     (scheduler/generate_call.cc Call::Run), so once this stream has ended
     the N can find it.
  3. after first: the memory figures, settled.
  4. shared: N requests sent at once, each the prefix + its own suffix,
     max_tokens SHARED_MAX_TOKENS, while the worker's figures are sampled
     every SAMPLE_S. TTFT p50/p99/max over those that ended OK;
     usage.cached_prompt_tokens of each (min/median/max).
  5. after: the memory figures, settled.

Where a checkpoint can be: the scheduler records a parked session's prompt
checkpoint (rewind_pos: its prompt's end), its committed end and the prefix
checkpoints the worker saved inside its prompts (multiples of the worker's
--prefix_checkpoint_interval, default 1,024; scheduler/prefix_reuse.cc
RecordParked, DESIGN.md "Prefix reuse"). The cached target of each of the N
is P: in the prefix variant the first request's prompt checkpoint is at P;
in the suffix variant P is a multiple of the interval inside its prompt (for
the P this bench uses), so a hit gives cached_prompt_tokens == P in both.

Memory: the bench calls specserve.worker.v1.Worker/GetWorkerInfo on the
worker itself (through its reflection service; no claim_sessions, so the
calls keep no session alive). WorkerInfo has memory_used_bytes (device bytes
of the sessions' caches and checkpoints, SessionPool::Stats), host_memory_
used_bytes (offloaded ones), sessions and memory_budget_bytes. No RPC the
bench can make gives one session's bytes (SessionState.bytes comes back only
from session calls by the session's owner, the scheduler) or says which
session is the cache-owned checkpoint, so the split is by differences:
  source bytes      after_first - before: the first request's session, kept
                    as the checkpoint (source_from "parked"), when the
                    worker's session count rose by one. Else the cache
                    released an older cache-owned session as it parked this
                    one (it holds at most --prefix_cache_sessions, 16 by
                    default), and the figure is the fullest sample taken
                    while the first request ran with exactly its session
                    added ("running"; samples every SAMPLE_S), or, with no
                    such sample, the net difference ("net": source_clean
                    False).
  per request       (used - after_first) / (sessions - after_first's) at the
                    sample with the most sessions during the N (the fullest
                    such, before any of the N ended if one of those saw all
                    N). Exact when
                    that sample saw all N sessions and none of the N had
                    ended yet (an ended one-shot request is parked as
                    cache-owned and can push an older one out):
                    per_request_clean.
  parked            (after - after_first) / the sessions added: what each
                    of the N holds once parked as a cache-owned session
                    (net of older ones the cache released meanwhile: at most
                    --prefix_cache_sessions, 16 by default, stay).
  prefix KV bytes   computed from ModelInfo: P x full-attention layers x 2
                    (K and V) x kv heads x head dim x the KV element's bytes
                    (kv_element_bytes: a --kv_cache_dtype worker argument's;
                    without one, fp32 on the CPU and bf16 on cuda:N, the
                    smaller of what "auto" has meant there, so that the bar
                    below is never met by a wrong guess).
The worker counts a session's bytes when it enters its pool (Admit, a fork)
and whenever a call hands it back (SessionPool::Insert and the lease's
release), so a sample taken while a request runs sees its session as
admitted or forked: its caches for its whole capacity (and a fork's copied
checkpoint), not yet the prompt checkpoint its burst saves.
Bars: TTFT p50 of the N <= TTFT_BAR_S; cached_prompt_tokens >= P for every
one of the N; held once: per-request bytes < prefix KV bytes (a request that
holds its own copy of the prefix's K/V rows holds at least that many bytes).

Settled: read every SETTLE_GAP_S until SETTLE_READS reads in a row agree on
used, host and sessions, at most SETTLE_TIMEOUT_S (the scheduler releases
sessions asynchronously, ReleaseNowOrLater).
"""
import asyncio
import random
import statistics
import threading
import time

import load
from reflect import ServerApi

WORKER_INFO = "specserve.worker.v1.Worker/GetWorkerInfo"
VARIANTS = ("suffix", "prefix")
TTFT_BAR_S = 0.2
FIRST_MAX_TOKENS = 4
SHARED_MAX_TOKENS = 4
SAMPLE_S = 0.02
SETTLE_GAP_S = 0.1
SETTLE_READS = 3
SETTLE_TIMEOUT_S = 5.0
# Bytes of one K or V element in the worker's attention caches by
# --kv_cache_dtype.
KV_ELEMENT_BYTES = {"fp32": 4, "bf16": 2}


def _ms(x):
    return None if x is None else 1e3 * x


def _mem(info, t):
    return {"t": t, "used": int(info.memory_used_bytes),
            "host": int(info.host_memory_used_bytes), "sessions": int(info.sessions),
            "budget": int(info.memory_budget_bytes), "active_bursts": int(info.active_bursts)}


def _read(wapi):
    """The worker's memory figures now, or {"error": ...}."""
    t = time.perf_counter()
    try:
        return _mem(wapi.call(WORKER_INFO, timeout=5.0), t)
    except Exception as e:  # the worker is gone or stuck: the row says so
        return {"t": t, "error": repr(e)[:300]}


async def _settled(wapi):
    """Reads until SETTLE_READS in a row agree (module docstring); the last
    read, with "settled" False when they never did."""
    deadline = time.perf_counter() + SETTLE_TIMEOUT_S
    same, last = 0, None
    while True:
        m = _read(wapi)
        if "error" in m:
            return m
        key = (m["used"], m["host"], m["sessions"])
        same = same + 1 if last is not None and key == last else 1
        last = key
        if same >= SETTLE_READS or time.perf_counter() > deadline:
            m["settled"] = same >= SETTLE_READS
            return m
        await asyncio.sleep(SETTLE_GAP_S)


class _Sampler:
    """The worker's figures every SAMPLE_S on a thread, from start() to
    stop()."""

    def __init__(self, wapi):
        self.wapi, self.samples = wapi, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while True:
            m = _read(self.wapi)
            if "error" not in m:
                self.samples.append(m)
            if self._stop.wait(SAMPLE_S):
                return

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join()


async def _measure(client, wapi, first_req, shared_reqs):
    """The row's timeline (module docstring); its raw figures."""
    await client.open()
    clock = time.perf_counter
    lag = load.LoopLag()
    cpu0, t0 = time.process_time(), clock()
    first, shared, mem = [], [], {}
    mem["before"] = await _settled(wapi)
    first_sampler = _Sampler(wapi).start()
    try:
        await client.one(first_req, first)
    finally:
        first_sampler.stop()
    mem["after_first"] = await _settled(wapi)
    sampler = _Sampler(wapi).start()
    t_shared = clock()
    try:
        await asyncio.gather(*(client.one(r, shared) for r in shared_reqs))
    finally:
        # Also when the time budget cancels this coroutine: no thread
        # outlives the row.
        t_end = clock()
        sampler.stop()
    mem["after"] = await _settled(wapi)
    wall = clock() - t0
    cpu = time.process_time() - cpu0
    lags = await lag.stop()
    return dict(first=first, shared=shared, mem=mem, first_samples=first_sampler.samples,
                samples=sampler.samples, t0=t0,
                t_shared=t_shared, t_end=t_end,
                m=dict(wall_s=wall, client_cpu_s=cpu, **lags))


def _distinct_suffixes(rng, count, length, vocab):
    out, seen = [], set()
    while len(out) < count:
        s = load.random_prompts(rng, 1, length, vocab)[0]
        if tuple(s) not in seen:
            seen.add(tuple(s))
            out.append(s)
    return out


def kv_element_bytes(worker_args, device):
    """(bytes, why) of one K or V element: the last --kv_cache_dtype of
    `worker_args`, else "auto": fp32 on the CPU; on cuda:N bf16, the smaller
    of what auto has meant there (fp32 before, bf16 since), which makes the
    held-once bar the harder one to meet."""
    dtype = "auto"
    for i, a in enumerate(worker_args):
        if a.startswith("--kv_cache_dtype="):
            dtype = a.split("=", 1)[1]
        elif a == "--kv_cache_dtype" and i + 1 < len(worker_args):
            dtype = worker_args[i + 1]
    if dtype in KV_ELEMENT_BYTES:
        return KV_ELEMENT_BYTES[dtype], "--kv_cache_dtype=" + dtype
    if device.startswith("cuda"):
        return KV_ELEMENT_BYTES["bf16"], "auto on %s: bf16 assumed" % device
    return KV_ELEMENT_BYTES["fp32"], "auto on %s: fp32" % device


def prefix_kv_bytes(model, tokens, kv_element_bytes):
    """Bytes of `tokens` rows of K and V over every full-attention layer
    (ModelInfo dict, as report.py reads it), or None."""
    types = model.get("layer_types") or []
    full = sum(1 for t in types if t in ("FULL_ATTENTION", "full_attention", 2))
    heads, dim = model.get("num_key_value_heads"), model.get("head_dim")
    if not (full and heads and dim):
        return None
    return tokens * full * 2 * int(heads) * int(dim) * kv_element_bytes


def run_row(client, worker_address, *, prefix_tokens, clients, suffix_tokens, first,
            vocab, seed, model, kv_element_bytes=4, kv_dtype_note="", pids=None,
            hard_s=None):
    """One shared_prefix row: P = prefix_tokens, N = clients, S =
    suffix_tokens, `first` one of VARIANTS. Whatever still runs hard_s
    seconds after the row's start is cut (recorded as cut). Returns the row
    dict (plus "records")."""
    if first not in VARIANTS:
        raise ValueError("shared_prefix: first is one of %s, not %r" % (VARIANTS, first))
    rng = random.Random(seed)
    P, N, S = prefix_tokens, clients, suffix_tokens
    prefix = load.random_prompts(rng, 1, P, vocab)[0]
    suffixes = _distinct_suffixes(rng, N + 1, S, vocab)
    first_ids = prefix + suffixes[0] if first == "suffix" else list(prefix)
    first_req = client.request(first_ids, FIRST_MAX_TOKENS, False, 0)
    shared_reqs = [client.request(prefix + s, SHARED_MAX_TOKENS, False, 0)
                   for s in suffixes[1:]]
    wapi = ServerApi(worker_address, symbols=("specserve.worker.v1.Worker",))
    try:
        raw, t_row, cpu = load.run_timed(
            client, _measure(client, wapi, first_req, shared_reqs), hard_s, pids)
    finally:
        wapi.close()
    row = dict(prompt_tokens=P, prefix_tokens=P, suffix_tokens=S, concurrency=N,
               clients=N, first=first, first_prompt_tokens=len(first_ids),
               first_max_tokens=FIRST_MAX_TOKENS, max_tokens=SHARED_MAX_TOKENS,
               spec=False, k=0, ttft_bar_ms=_ms(TTFT_BAR_S), cached_target=P,
               kv_element_bytes=kv_element_bytes, kv_dtype_note=kv_dtype_note,
               prefix_kv_bytes=prefix_kv_bytes(model, P, kv_element_bytes))
    if raw is None:
        row.update(requests=0, done=0, cut=1, errors={}, error_examples=[],
                   ttft_p50_ms=None, ttft_p99_ms=None, tok_s=0.0,
                   wall_s=time.perf_counter() - t_row, client_cpu_pct=None,
                   loop_lag_p99_ms=None, loop_lag_max_ms=None, client_limited=False,
                   records=[], note="cut at the time budget")
        return row
    row.update(_figures(raw, P, N, row["prefix_kv_bytes"]))
    wall = raw["m"]["wall_s"]
    for name, secs in cpu.items():
        row["%s_cpu_pct" % name] = 100.0 * secs / wall if wall > 0 else None
    return row


def _figures(raw, P, N, kv_bytes):
    first, shared = raw["first"], raw["shared"]
    recs = first + shared
    errors, cut = {}, 0
    for r in recs:
        if r.status == "CUT":
            cut += 1
        elif r.status != "OK":
            errors[r.status] = errors.get(r.status, 0) + 1
    ok = [r for r in shared if r.status == "OK"]
    out = {"requests": len(recs), "done": sum(1 for r in recs if r.status == "OK"),
           "cut": cut, "errors": errors,
           "error_examples": sorted({"%s: %s" % (r.status, r.error[:160]) for r in recs
                                     if r.status not in ("OK", "CUT")})[:5],
           "shared_done": len(ok)}
    f = first[0] if first else None
    out["first_status"] = f.status if f else None
    out["first_ttft_ms"] = _ms(f.ttft) if f is not None and f.status == "OK" else None
    out["first_cached_prompt_tokens"] = f.cached_prompt_tokens if f is not None else None
    ttft = [r.ttft for r in ok if r.ttft is not None]
    out["ttft_p50_ms"] = _ms(load.percentile(ttft, 50))
    out["ttft_p99_ms"] = _ms(load.percentile(ttft, 99))
    out["ttft_max_ms"] = _ms(max(ttft)) if ttft else None
    out["ttft_min_ms"] = _ms(min(ttft)) if ttft else None
    if out["ttft_p50_ms"] is not None:
        out["ttft_ok"] = out["ttft_p50_ms"] <= _ms(TTFT_BAR_S)
    cached = [r.cached_prompt_tokens for r in ok if r.cached_prompt_tokens is not None]
    out["cached_prompt_tokens"] = cached
    out["cached_min"] = min(cached) if cached else None
    out["cached_median"] = statistics.median(cached) if cached else None
    out["cached_max"] = max(cached) if cached else None
    out["cached_at_target"] = sum(1 for c in cached if c >= P)
    # Every one of the N (an errored or cut one has none: not met).
    out["cached_ok"] = len(cached) == N and out["cached_at_target"] == N
    # Memory (module docstring).
    mem, samples = raw["mem"], raw["samples"]
    t0 = raw["t0"]

    def rel(m):
        m = dict(m)
        m["t_s"] = m.pop("t") - t0
        return m

    out["memory"] = {k: rel(v) for k, v in mem.items()}
    errs = ["%s: %s" % (k, v["error"]) for k, v in mem.items() if "error" in v]
    if errs:
        out["memory_error"] = "; ".join(errs)
    before, a1, after = mem.get("before"), mem.get("after_first"), mem.get("after")
    good = [m for m in (before, a1, after) if m and "error" not in m]
    if good:
        out["memory_budget_bytes"] = good[0]["budget"]
    if before and a1 and "error" not in before and "error" not in a1:
        out["source_parked_delta_bytes"] = a1["used"] - before["used"]
        out["source_host_bytes"] = a1["host"] - before["host"]
        out["source_sessions_delta"] = a1["sessions"] - before["sessions"]
        parked_clean = (out["source_sessions_delta"] == 1 and
                        out["source_host_bytes"] == 0 and
                        before.get("settled", False) and a1.get("settled", False))
        # While it ran: the fullest sample with exactly its session added.
        running = [m for m in raw["first_samples"]
                   if m["sessions"] == before["sessions"] + 1 and m["host"] == before["host"]]
        if running:
            out["source_running_bytes"] = max(m["used"] for m in running) - before["used"]
        if parked_clean:
            out["source_bytes"], out["source_from"] = out["source_parked_delta_bytes"], "parked"
        elif running:
            out["source_bytes"], out["source_from"] = out["source_running_bytes"], "running"
        else:
            out["source_bytes"], out["source_from"] = out["source_parked_delta_bytes"], "net"
        out["source_clean"] = out["source_from"] != "net"
    out["memory_samples"] = len(samples)
    if a1 and "error" not in a1 and samples:
        # The fullest sample with the most sessions, taken before any of the
        # N ended when one such saw all N (an ended request's session is
        # parked: counted with its checkpoint, and it may push an older
        # cache-owned one out).
        ends = [r.end for r in shared if r.end is not None]
        pre = [m for m in samples if not ends or m["t"] < min(ends)]
        if not pre or max(m["sessions"] for m in pre) - a1["sessions"] < N:
            pre = samples
        peak = max(pre, key=lambda m: (m["sessions"], m["used"]))
        added = peak["sessions"] - a1["sessions"]
        out["peak_used_bytes"] = peak["used"]
        out["peak_host_bytes"] = peak["host"]
        out["peak_sessions"] = peak["sessions"]
        out["peak_sessions_added"] = added
        out["peak_t_s"] = peak["t"] - t0
        # Of the N, those that had ended by the peak sample.
        out["peak_ended_before"] = sum(1 for r in shared if r.end is not None
                                       and r.end < peak["t"])
        out["peak_used_max_bytes"] = max(m["used"] for m in samples)
        if added > 0:
            out["per_request_bytes"] = (peak["used"] - a1["used"]) / added
        out["per_request_clean"] = (added == N and out["peak_ended_before"] == 0 and
                                    peak["host"] == a1["host"])
    if after and "error" not in after and a1 and "error" not in a1:
        out["after_used_bytes"] = after["used"]
        out["after_sessions"] = after["sessions"]
        out["after_bytes_over_first"] = after["used"] - a1["used"]
        # What each of the N holds once parked as a cache-owned checkpoint
        # (net of any older one the cache released meanwhile).
        added = after["sessions"] - a1["sessions"]
        out["after_sessions_added"] = added
        if added > 0:
            out["after_per_session_bytes"] = out["after_bytes_over_first"] / added
    if kv_bytes and out.get("per_request_bytes") is not None:
        out["per_request_over_prefix_kv"] = out["per_request_bytes"] / kv_bytes
        out["held_once"] = out["per_request_bytes"] < kv_bytes
    if kv_bytes and out.get("source_bytes"):
        out["source_over_prefix_kv"] = out["source_bytes"] / kv_bytes
    # The fields every row has (serve_bench's log line, report.py's totals).
    m = raw["m"]
    wall = m["wall_s"]
    tokens = sum(r.tokens for r in recs if r.status in ("OK", "CUT"))
    shared_wall = (raw["t_end"] - raw["t_shared"]) if raw["t_shared"] and raw["t_end"] else None
    out.update(wall_s=wall, shared_wall_s=shared_wall, output_tokens=tokens,
               tok_s=tokens / wall if wall > 0 else 0.0, client_cpu_s=m["client_cpu_s"],
               client_cpu_pct=100.0 * m["client_cpu_s"] / wall if wall > 0 else None,
               loop_lag_p99_ms=m["loop_lag_p99_ms"], loop_lag_max_ms=m["loop_lag_max_ms"])
    # TTFT is an arrival time on the client's loop: the same check as every
    # row's.
    out["client_limited"] = bool(out["done"] and wall >= 1.0 and (
        (out["client_cpu_pct"] or 0) > load.CLIENT_CPU_LIMIT_PCT or
        out["loop_lag_p99_ms"] > load.LOOP_LAG_LIMIT_MS))
    records = []
    for role, rs in (("first", first), ("shared", shared)):
        for r in rs:
            j = r.to_json()
            j.update(role=role, start_s=r.start - t0,
                     e2e_s=None if r.end is None else r.end - r.start)
            records.append(j)
    out["records"] = records
    return out
