"""serve_bench's long-context decode rows: c sessions decoding together at a
context of P tokens, their steady time per output token beside cuda_bench's
(h) DecodeBatch step at the same (context, B) and its state-inclusive floor.

One row per (P, c), on one LoadClient (one asyncio loop, one channel):
  1. c requests sent at once, each a fresh random P-token prompt (distinct:
     no prefix reuse between them or with an earlier row), greedy,
     ignore_eos, speculation off, max_tokens `request_max_tokens` (well past
     what the row needs: a stream that ended early would leave fewer than c
     in the batch).
  2. The prompts prefill one after another or interleaved with the streams
     already decoding; T_all = the arrival of the LAST stream's first token.
     From then on all c sessions are in the batch at context >= P.
  3. Once every stream has received `window_tokens` ids after T_all, the row
     cancels the streams (a planned end: counted as cancelled, not as an
     error or a cut).

A stream's window: its id-carrying messages after T_all up to the one that
brings its count after T_all to window_tokens, and at least two messages
(a scheduler that sends many ids per message may need more than
window_tokens). Its TPOT = (the window's last
arrival - its first arrival) / the ids of the window's messages after the
first: the gap that spans T_all (the last prompt's prefill) is left out, so
no prefill pollutes it. TPOT p50/p99 are over the c streams.
  decode tok/s   ids arriving in (T_all, T_done] over all streams /
                 (T_done - T_all), T_done the last stream's window end
  gap p50/p99    the gaps between consecutive window messages, all streams
  TTFT p50/p99   of the c requests (from the send: queueing behind the
                 other prompts' prefill included); TTFT max = T_all - send
  ctx mean       P + the ids a stream had at T_all + half its window, over
                 the streams: the context the window decoded at (the first
                 streams decode while the later prompts prefill, so theirs
                 is above P)
The first step of a new (batch size, 256-row position bucket) runs op by
op and the second records its graph (worker/model/model.h
kGraphPositionBucket): the window's B = c at context P is a new key, so one
or two of its steps are slower (at most ~2 steps in window_tokens of TPOT;
they show in gap max).
"""
import asyncio
import random
import time

import load
from reflect import ServerApi

WORKER_INFO = "specserve.worker.v1.Worker/GetWorkerInfo"
POLL_S = 0.005
# A prompt's prefill while other sessions decode beside it takes this many
# times its solo time (PERF.md "Prefill under load": 3.9x at 8 streams; the
# fit check below is a guess, not a bar).
PREFILL_UNDER_LOAD_X = 3.0
# (h)'s contexts (tools/cuda_bench/cuda_bench.cc LongContextBench's plan):
# --long_context=P filters that plan, so it helps only for these.
BENCH_CONTEXTS = (2048, 8192, 32768)


class _Stream:
    """One request's record and its ids-carrying messages' (arrival, ids)."""

    def __init__(self):
        self.arrivals = []
        self.records = []
        self.task = None

    def on_ids(self, t, n):
        self.arrivals.append((t, n))


async def _wait(streams, ready):
    while not all(ready(s) for s in streams):
        await asyncio.sleep(POLL_S)


async def _measure(client, reqs, window_tokens):
    """The row's timeline (module docstring); returns its raw figures."""
    await client.open()
    clock = time.perf_counter
    lag = load.LoopLag()
    cpu0, t0 = time.process_time(), clock()
    streams = [_Stream() for _ in reqs]
    t_all = None
    try:
        for s, r in zip(streams, reqs):
            s.task = asyncio.ensure_future(client.one(r, s.records, on_ids=s.on_ids))
        await _wait(streams, lambda s: s.arrivals or s.task.done())
        firsts = [s.arrivals[0][0] for s in streams if s.arrivals]
        if firsts:
            t_all = max(firsts)
            await _wait(streams, lambda s: s.task.done() or window_complete(
                [a for a in s.arrivals if a[0] > t_all], window_tokens))
        cancelled = load.cancel_running(streams)
    finally:
        await load.reap_streams(streams)
    wall = clock() - t0
    cpu = time.process_time() - cpu0
    lags = await lag.stop()
    return dict(streams=streams, cancelled=cancelled, t0=t0, t_all=t_all,
                m=dict(wall_s=wall, client_cpu_s=cpu, **lags))


def window_complete(window, window_tokens):
    """A window holds window_tokens ids and at least two messages (one
    message alone has no gap to time)."""
    return len(window) >= 2 and sum(k for _, k in window) >= window_tokens


def stream_window(arrivals, t_all, window_tokens):
    """The messages of one stream's window: those after t_all up to the
    first that completes it (window_complete), or all after t_all when the
    stream ended sooner."""
    out = []
    for t, k in arrivals:
        if t > t_all:
            out.append((t, k))
            if window_complete(out, window_tokens):
                break
    return out


def window_figures(streams_arrivals, t_all, window_tokens, prompt_tokens):
    """TPOT per stream, gaps, decode tok/s and the mean context of the
    window (module docstring), from each stream's [(arrival, ids)]."""
    tpots, gaps, ctxs, ends, short, messages, ids_after = [], [], [], [], 0, 0, 0
    for arrivals in streams_arrivals:
        w = stream_window(arrivals, t_all, window_tokens)
        messages += max(0, len(w) - 1)
        ids_after += sum(k for _, k in w[1:])
        if sum(k for _, k in w) < window_tokens:
            short += 1
        before = sum(k for t, k in arrivals if t <= t_all)
        ctxs.append(prompt_tokens + before + sum(k for _, k in w) / 2.0)
        if len(w) >= 2:
            tpots.append((w[-1][0] - w[0][0]) / sum(k for _, k in w[1:]))
            gaps += [w[i][0] - w[i - 1][0] for i in range(1, len(w))]
        if w:
            ends.append(w[-1][0])
    out = {"streams_short": short, "tpots": tpots, "gaps": gaps,
           "ctx_mean": sum(ctxs) / len(ctxs) if ctxs else None,
           # More than 1: the scheduler sent several ids in one message, and
           # a TPOT over messages then averages over their arrival in bursts.
           "ids_per_message": ids_after / messages if messages else None}
    if ends and max(ends) > t_all:
        t_done = max(ends)
        ids = sum(k for arrivals in streams_arrivals for t, k in arrivals
                  if t_all < t <= t_done)
        out.update(window_s=t_done - t_all, window_ids=ids, tok_s=ids / (t_done - t_all))
    return out


def run_row(client, *, prompt_tokens, clients, window_tokens, request_max_tokens,
            vocab, seed, pids=None, hard_s=None):
    """One context row at P = prompt_tokens with c = clients streams.
    Whatever still runs hard_s seconds after the row's start is cut
    (recorded as cut). Returns the row dict (plus "records")."""
    rng = random.Random(seed)
    P, c = prompt_tokens, clients
    reqs = [client.request(ids, request_max_tokens, False, 0)
            for ids in load.random_prompts(rng, c, P, vocab)]
    raw, t_row, cpu = load.run_timed(client, _measure(client, reqs, window_tokens),
                                     hard_s, pids)
    row = dict(prompt_tokens=P, context=P, concurrency=c, clients=c,
               max_tokens=window_tokens, window_tokens=window_tokens,
               request_max_tokens=request_max_tokens, spec=False, k=0)
    if raw is None:
        row.update(requests=0, done=0, cut=c, errors={}, error_examples=[],
                   ttft_p50_ms=None, ttft_p99_ms=None, tpot_p50_ms=None, tpot_p99_ms=None,
                   tok_s=0.0, wall_s=time.perf_counter() - t_row, client_cpu_pct=None,
                   loop_lag_p99_ms=None, loop_lag_max_ms=None, client_limited=False,
                   records=[], note="cut at the time budget")
        return row
    row.update(_figures(raw, P, window_tokens))
    wall = raw["m"]["wall_s"]
    for name, secs in cpu.items():
        row["%s_cpu_pct" % name] = 100.0 * secs / wall if wall > 0 else None
    return row


def _ms(x):
    return None if x is None else 1e3 * x


def _figures(raw, P, window_tokens):
    streams, cancelled = raw["streams"], set(raw["cancelled"])
    recs = [s.records[0] for s in streams if s.records]
    planned = {id(streams[i].records[0]) for i in cancelled if streams[i].records}
    out = load.count_statuses(recs, planned)
    out.update(streams_cancelled=len(planned),
               # Ended on their own (an error, or request_max_tokens reached)
               # before the row was done with them: the window then had
               # fewer than c sessions in the batch.
               streams_ended_early=len(recs) - len(planned),
               streams_without_first_token=sum(1 for s in streams if not s.arrivals))
    ttft = [r.ttft for r in recs if r.ttft is not None]
    out.update(ttft_p50_ms=_ms(load.percentile(ttft, 50)),
               ttft_p99_ms=_ms(load.percentile(ttft, 99)),
               ttft_max_ms=_ms(max(ttft)) if ttft else None)
    t_all = raw["t_all"]
    out["tpot_p50_ms"] = out["tpot_p99_ms"] = None
    out["tok_s"] = 0.0
    if t_all is not None:
        w = window_figures([s.arrivals for s in streams], t_all, window_tokens, P)
        gaps = w["gaps"]
        out.update(
            tpot_p50_ms=_ms(load.percentile(w["tpots"], 50)),
            tpot_p99_ms=_ms(load.percentile(w["tpots"], 99)),
            tpot_streams_ms=[_ms(x) for x in w["tpots"]],
            gap_p50_ms=_ms(load.percentile(gaps, 50)), gap_p99_ms=_ms(load.percentile(gaps, 99)),
            gap_max_ms=_ms(max(gaps)) if gaps else None,
            window_gaps=len(gaps), window_s=w.get("window_s"), window_ids=w.get("window_ids"),
            tok_s=w.get("tok_s", 0.0), ctx_mean=w["ctx_mean"], streams_short=w["streams_short"],
            window_ids_per_message=w["ids_per_message"],
            t_all_s=t_all - raw["t0"])
    out.update(load.client_figures(raw["m"], out["done"]))
    out["output_tokens"] = sum(r.tokens for r in recs)
    records = []
    for r in recs:
        j = r.to_json()
        j.update(start_s=r.start - raw["t0"], cancelled_by_row=id(r) in planned)
        records.append(j)
    out["records"] = records
    return out


# ---- Will a row fit? (skipped beforehand, with the reason, when not.)

def session_bytes_lower_bound(model, rows, kv_element_bytes, state_element_bytes=2):
    """Device bytes one session of `rows` rows holds at least: K and V of
    every full-attention layer for its capacity, and every linear layer's
    recurrent state (bf16, the smaller of its element types) and conv
    window (no checkpoints, no workspace). None when the ModelInfo dict
    lacks a figure."""
    g = model.get
    types = g("layer_types") or []
    full = sum(1 for t in types if t in ("FULL_ATTENTION", "full_attention", 2))
    linear = len(types) - full
    try:
        kv = rows * full * 2 * int(g("num_key_value_heads")) * int(g("head_dim")) * \
            kv_element_bytes
        nk, nv = int(g("linear_num_key_heads")), int(g("linear_num_value_heads"))
        dk, dv = int(g("linear_key_head_dim")), int(g("linear_value_head_dim"))
        conv = (2 * nk * dk + nv * dv) * (int(g("linear_conv_kernel_dim")) - 1) * 4
    except (TypeError, ValueError):
        return None
    return kv + linear * (nv * dk * dv * state_element_bytes + conv)


def worker_budget_bytes(worker_address):
    """The worker's device memory for sessions (GetWorkerInfo
    memory_budget_bytes), or None."""
    try:
        wapi = ServerApi(worker_address, symbols=("specserve.worker.v1.Worker",))
        try:
            return int(wapi.call(WORKER_INFO, timeout=5.0).memory_budget_bytes) or None
        finally:
            wapi.close()
    except Exception:  # the check is advisory: the row runs
        return None


def prefill_rate(result, prompt_tokens):
    """Prompt tokens per second of a solo prefill, from this run: the TTFT
    row at P, else the TTFT row of the longest prompt, else cuda_bench's
    longest (f) prefill. None when there is none."""
    tt = [r for r in result.get("rows", []) if r["kind"] == "ttft" and r.get("ttft_p50_ms")]
    same = [r for r in tt if r["prompt_tokens"] == prompt_tokens]
    pick = same or sorted(tt, key=lambda r: r["prompt_tokens"])[-1:]
    if pick:
        return pick[0]["prompt_tokens"] * 1e3 / pick[0]["ttft_p50_ms"]
    pre = ((result.get("cuda_bench") or {}).get("model_27b") or {}).get("prefill") or []
    if pre:
        e = max(pre, key=lambda e: e["P"])
        return e["P"] * 1e3 / e["ms"]
    return None


def estimate_seconds(rate, prompt_tokens, clients, window_tokens, step_ms):
    """A rough guess of the row's seconds: the first prompt's prefill alone,
    the others' under load, then the window's steps. None without a rate."""
    if not rate:
        return None
    one = prompt_tokens / rate
    return one * (1 + (clients - 1) * PREFILL_UNDER_LOAD_X) + \
        (window_tokens + 32) * (step_ms or 0.0) / 1e3


def _size(n):
    return "%.1f GiB" % (n / 2.0 ** 30) if n >= 2 ** 30 else "%.1f MiB" % (n / 2.0 ** 20)


def skip_reason(*, clients, prompt_tokens, request_max_tokens, window_tokens, model,
                kv_element_bytes, budget_bytes, rate, step_ms, seconds_left):
    """'' when the row may run; else why not: its sessions' bytes (a lower
    bound) past the worker's memory budget, or its estimated seconds past
    the time left (seconds_left None: no time budget)."""
    one = session_bytes_lower_bound(model, prompt_tokens + request_max_tokens,
                                    kv_element_bytes)
    if one and budget_bytes and clients * one > budget_bytes:
        return ("memory: %d sessions of %d rows hold >= %s, the worker's session budget is "
                "%s" % (clients, prompt_tokens + request_max_tokens, _size(clients * one),
                        _size(budget_bytes)))
    est = estimate_seconds(rate, prompt_tokens, clients, window_tokens, step_ms)
    if est is not None and seconds_left is not None and est > seconds_left:
        return "time budget: needs ~%.0f s, %.0f s left" % (est, seconds_left)
    return ""
