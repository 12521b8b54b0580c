"""serve_bench's prefill-under-load row: what one long prompt's prefill costs
the sessions decoding beside it, and what they cost it.

One row per prompt length P, on one LoadClient (one asyncio loop, one
channel):
  1. solo: a warm-up request (not timed; its errors count), then
     `solo_repeats` requests, each of a fresh random P-token prompt
     (max_tokens 1), one at a time with nothing else running; solo TTFT =
     their median. Fresh prompts: a repeated one would be served from the
     scheduler's prefix cache.
  2. load: N plain greedy streams (ignore_eos, random stream prompts, a
     max_tokens well past the prefill). Once every stream has received
     STEADY_TOKENS tokens, and then baseline_s more seconds, the prefill
     request (a fresh random P-token prompt, max_tokens 1) is sent; its TTFT
     is the TTFT under load. Once it has finished and every stream has had
     TAIL_MESSAGES more messages after the window's end, the row cancels
     the streams (a planned end: counted as cancelled, not as an error).

Inter-token gap: the time between two consecutive messages of one stream
that carry token ids. A message of n > 1 tokens counts as one gap
(tokens_per_message says whether the scheduler coalesced any).
  solo step   the median gap arriving in [send - baseline_s, send)
  window      [send, prefill's first token + solo step]; its gaps are those
              that overlap it (arriving at or after the send, begun at or
              before its end): every gap the prefill can have stretched,
              also a stall that lasts past the window's end; their p50, p99
              and max are over all streams' gaps together
The bars of the acceptance (issue: prefill interleaved with decode): p99
window gap <= STEP_BAR x solo step, TTFT under load <= TTFT_BAR x solo TTFT.
"""
import asyncio
import random
import statistics
import time

import load

STEP_BAR = 3.0
TTFT_BAR = 1.5
# Tokens every stream has received before the baseline window opens: past
# its first burst and the batch's step-shape recording.
STEADY_TOKENS = 16
# Messages every live stream receives after the window's end before the row
# cancels it, so that no stream's window is cut short.
TAIL_MESSAGES = 4
# The most seconds the row waits, after the prefill has finished, for the
# streams' TAIL_MESSAGES; a stream still short of them then has stalled (it
# is cancelled all the same, and its window gaps are short of the stall).
TAIL_TIMEOUT_S = 10.0
POLL_S = 0.005


def _ms(x):
    return None if x is None else 1e3 * x


def _pct_ms(xs, q):
    return _ms(load.percentile(xs, q))


class _Stream:
    """One decoding stream: its record and every ids-carrying message's
    (arrival time, ids)."""

    def __init__(self):
        self.arrivals = []
        self.records = []  # its one Record, once the stream has ended
        self.task = None

    def on_ids(self, t, n):
        self.arrivals.append((t, n))

    def tokens(self):
        return sum(n for _, n in self.arrivals)

    def gaps_arriving(self, lo, hi):
        """[(gap s, ids of the later message, its arrival)] of the gaps
        arriving in [lo, hi)."""
        a = self.arrivals
        return [(a[i][0] - a[i - 1][0], a[i][1], a[i][0]) for i in range(1, len(a))
                if lo <= a[i][0] < hi]

    def gaps_overlapping(self, lo, hi):
        """The same of the gaps that overlap [lo, hi]: arriving at or after
        lo, begun at or before hi."""
        a = self.arrivals
        return [(a[i][0] - a[i - 1][0], a[i][1], a[i][0]) for i in range(1, len(a))
                if a[i][0] >= lo and a[i - 1][0] <= hi]


def _solo_step(streams, t_send, baseline_s):
    """The median gap arriving in the baseline window, or None."""
    base = [g for s in streams for g, _, _ in s.gaps_arriving(t_send - baseline_s, t_send)]
    return statistics.median(base) if base else None


async def _measure(client, solo_reqs, stream_reqs, prefill_req, baseline_s):
    """The row's timeline (module docstring). Returns its raw figures: the
    records, the streams' arrivals, the send and first-token times
    (time.perf_counter; None when the prefill was never sent)."""
    await client.open()
    clock = time.perf_counter
    lag = load.LoopLag()
    cpu0, t0 = time.process_time(), clock()
    warm, solo, prefill = [], [], []
    streams = [_Stream() for _ in stream_reqs]
    t_send = t_first = None
    steady = False
    try:
        await client.one(solo_reqs[0], warm)
        for r in solo_reqs[1:]:
            await client.one(r, solo)
        t_load = clock()
        for s, r in zip(streams, stream_reqs):
            s.task = asyncio.ensure_future(client.one(r, s.records, on_ids=s.on_ids))

        def all_running():
            return all(not s.task.done() for s in streams)

        while all_running() and min(s.tokens() for s in streams) < STEADY_TOKENS:
            await asyncio.sleep(POLL_S)
        if all_running():
            await asyncio.sleep(baseline_s)
            steady = all_running()
        if steady:
            await client.one(prefill_req, prefill)
            p = prefill[0]
            # LoadClient.one: the record's start is the TTFT's send time.
            t_send = p.start
            t_first = p.start + p.ttft if p.ttft is not None else p.end
            t_end = t_first + (_solo_step(streams, t_send, baseline_s) or 0.0)
            deadline = clock() + TAIL_TIMEOUT_S

            def tail_done(s):
                return (s.task.done() or
                        sum(1 for t, _ in s.arrivals if t > t_end) >= TAIL_MESSAGES)

            while not all(tail_done(s) for s in streams) and clock() < deadline:
                await asyncio.sleep(POLL_S)
        cancelled = load.cancel_running(streams)
    finally:
        await load.reap_streams(streams)
    wall = clock() - t0
    cpu = time.process_time() - cpu0
    lags = await lag.stop()
    return dict(warm=warm, solo=solo, streams=streams, prefill=prefill,
                cancelled=cancelled, steady=steady, t0=t0, t_load=t_load,
                t_send=t_send, t_first=t_first,
                m=dict(wall_s=wall, client_cpu_s=cpu, **lags))


def run_row(client, *, prompt_tokens, streams, stream_prompt_tokens,
            stream_max_tokens, vocab, seed, solo_repeats=3, baseline_s=1.0,
            pids=None, hard_s=None):
    """One prefill_load row at P = prompt_tokens with `streams` decoding
    streams. Whatever still runs hard_s seconds after the row's start is cut
    (recorded as cut). Returns the row dict (plus "records")."""
    rng = random.Random(seed)
    P, N = prompt_tokens, streams
    solo_reqs = [client.request(ids, 1, False, 0) for ids in
                 load.random_prompts(rng, 1 + solo_repeats, P, vocab)]
    stream_reqs = [client.request(ids, stream_max_tokens, False, 0) for ids in
                   load.random_prompts(rng, N, stream_prompt_tokens, vocab)]
    prefill_req = client.request(load.random_prompts(rng, 1, P, vocab)[0], 1, False, 0)
    raw, t_row, cpu = load.run_timed(
        client, _measure(client, solo_reqs, stream_reqs, prefill_req, baseline_s),
        hard_s, pids)
    row = dict(prompt_tokens=P, concurrency=N, streams=N,
               stream_prompt_tokens=stream_prompt_tokens,
               stream_max_tokens=stream_max_tokens, max_tokens=1, spec=False, k=0,
               solo_repeats=solo_repeats, baseline_s=baseline_s,
               step_bar=STEP_BAR, ttft_bar=TTFT_BAR)
    if raw is None:
        wall = time.perf_counter() - t_row
        row.update(requests=0, done=0, cut=1, errors={}, error_examples=[],
                   ttft_p50_ms=None, ttft_p99_ms=None, ttft_load_ms=None, tok_s=0.0,
                   wall_s=wall, client_cpu_pct=None, loop_lag_p99_ms=None,
                   loop_lag_max_ms=None, client_limited=False, records=[],
                   note="cut at the time budget")
        return row
    row.update(_figures(raw, baseline_s))
    wall = raw["m"]["wall_s"]
    for name, secs in cpu.items():
        row["%s_cpu_pct" % name] = 100.0 * secs / wall if wall > 0 else None
    return row


def _figures(raw, baseline_s):
    streams, cancelled = raw["streams"], set(raw["cancelled"])
    stream_recs = [s.records[0] for s in streams if s.records]
    recs = raw["solo"] + raw["prefill"] + stream_recs
    # A stream the row cancelled ends as CUT by design; any other CUT is the
    # time budget's. (Warm-up errors count as errors too.)
    planned = {id(streams[i].records[0]) for i in cancelled if streams[i].records}
    errors, cut = {}, 0
    for r in raw["warm"] + recs:
        if r.status == "OK" or id(r) in planned:
            continue
        if r.status == "CUT":
            cut += 1
        else:
            errors[r.status] = errors.get(r.status, 0) + 1
    out = {"requests": len(recs), "cut": cut, "errors": errors,
           "done": sum(1 for r in recs if r.status == "OK" or id(r) in planned),
           "error_examples": sorted({"%s: %s" % (r.status, r.error[:160])
                                     for r in raw["warm"] + recs
                                     if r.status not in ("OK", "CUT")})[:5],
           "warmup_errors": sum(r.status not in ("OK", "CUT") for r in raw["warm"]),
           "streams_cancelled": len(planned),
           # Ended on their own (an error, or max_tokens reached) before the
           # row was done with them.
           "streams_ended_early": len(stream_recs) - len(planned),
           "steady": raw["steady"], "load_start_s": raw["t_load"] - raw["t0"]}
    solo = [r.ttft for r in raw["solo"] if r.status == "OK" and r.ttft is not None]
    out["solo_ttft_runs_ms"] = [_ms(x) for x in solo]
    out["solo_ttft_ms"] = _ms(statistics.median(solo)) if solo else None
    p = raw["prefill"][0] if raw["prefill"] else None
    out["ttft_load_ms"] = _ms(p.ttft) if p is not None and p.status == "OK" else None
    if out["solo_ttft_ms"] and out["ttft_load_ms"] is not None:
        out["ttft_over_solo"] = out["ttft_load_ms"] / out["solo_ttft_ms"]
        out["ttft_ok"] = out["ttft_over_solo"] <= TTFT_BAR
    # The fields every row has (serve_bench's log line, report.py's totals).
    out["ttft_p50_ms"] = out["ttft_p99_ms"] = out["ttft_load_ms"]
    t_send, t_first = raw["t_send"], raw["t_first"]
    if t_send is not None:
        step = _solo_step(streams, t_send, baseline_s)
        t_end = t_first + (step or 0.0)
        base = [x for s in streams for x in s.gaps_arriving(t_send - baseline_s, t_send)]
        win = [(j, x) for j, s in enumerate(streams) for x in s.gaps_overlapping(t_send, t_end)]
        gaps = [g for _, (g, _, _) in win]
        during = [sum(n for t, n in s.arrivals if t_send <= t < t_first) for s in streams]
        out.update(
            solo_step_ms=_ms(step), baseline_gaps=len(base),
            baseline_tokens_per_message=sum(n for _, n, _ in base) / len(base) if base else None,
            window_ms=_ms(t_end - t_send), window_gaps=len(win),
            window_tokens_per_message=(sum(n for _, (_, n, _) in win) / len(win)) if win else None,
            gap_p50_ms=_pct_ms(gaps, 50), gap_p99_ms=_pct_ms(gaps, 99),
            gap_max_ms=_ms(max(gaps)) if gaps else None,
            # Tokens the streams received while the prompt was prefilled
            # (send to first token): all streams, and the stream with fewest.
            prefill_stream_tokens=sum(during), prefill_stream_tokens_min=min(during),
            # Every stream had a message after the window's end: the gap
            # that spans it is closed, so none of its window gaps is missing.
            window_covered=all(s.arrivals and s.arrivals[-1][0] > t_end for s in streams))
        if step and out["gap_p99_ms"] is not None:
            out["gap_p99_over_step"] = out["gap_p99_ms"] / out["solo_step_ms"]
            out["step_ok"] = out["gap_p99_over_step"] <= STEP_BAR
        # The ten longest window gaps: which stream, arriving when after the
        # send.
        worst = sorted(win, key=lambda x: -x[1][0])[:10]
        out["longest_gaps"] = [{"stream": j, "gap_ms": 1e3 * g, "arrived_ms": 1e3 * (t - t_send)}
                               for j, (g, _, t) in worst]
    m = raw["m"]
    wall = m["wall_s"]
    out.update(wall_s=wall, client_cpu_s=m["client_cpu_s"],
               client_cpu_pct=100.0 * m["client_cpu_s"] / wall if wall > 0 else None,
               loop_lag_p99_ms=m["loop_lag_p99_ms"], loop_lag_max_ms=m["loop_lag_max_ms"])
    out["output_tokens"] = sum(s.tokens() for s in streams)
    out["tok_s"] = out["output_tokens"] / wall if wall > 0 else 0.0
    # The gaps are arrival times on the client's loop: a late loop stretches
    # them, so the same check as every row's.
    out["client_limited"] = bool(out["done"] and wall >= 1.0 and (
        (out["client_cpu_pct"] or 0) > load.CLIENT_CPU_LIMIT_PCT or
        out["loop_lag_p99_ms"] > load.LOOP_LAG_LIMIT_MS))
    records = []
    for role, rs in (("solo", raw["solo"]), ("prefill", raw["prefill"]),
                     ("stream", stream_recs)):
        for r in rs:
            j = r.to_json()
            j.update(role=role, start_s=r.start - raw["t0"], cancelled_by_row=id(r) in planned)
            records.append(j)
    out["records"] = records
    return out
