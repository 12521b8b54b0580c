"""serve_bench's mixed closed-loop rows: C clients, each looping over
requests of a fresh P-token prompt and O output tokens, their arrivals not
synchronized, so that prompts prefill while the other clients decode, as
they do in service.

One row per (P, O, C), on one LoadClient (one asyncio loop, one channel),
every request greedy, ignore_eos, speculation off:
  1. probe: one request alone (a fresh P-token prompt, max_tokens
     min(O, PROBE_TOKENS)); it also warms the path. The expected time of
     one request E = its TTFT + O x the step (cuda_bench's DecodeBatch step
     at B = C when the run has one, else the probe's own TPOT).
  2. loops: client i starts after a delay d_i drawn uniformly from [0, E)
     by a seeded RNG (random.Random(seed)), then sends a request (a fresh
     random P-token prompt, max_tokens O), reads its stream to the end and
     sends the next at once, until the row stops.
  3. stop: `seconds` after the last client's first send (the window
     [W0, W0 + seconds], W0 that send: every client is looping in it), or
     earlier when the time budget would cut the row. The requests still in
     flight are cancelled by the row: a planned end, counted as cancelled
     at the end, not as an error or a cut.

Figures, over the window [W0, stop]:
  tok/s         ids arriving in the window, all requests / its length
  TTFT p50/p99  of the requests sent in the window that had their first
                token by the stop (those that had not: ttft_censored)
  TPOT p50/p99  per request: the gaps between its consecutive id-carrying
                messages that arrive in the window (the first token's own
                wait excluded) / the ids they brought; a request counts
                with at least min(MIN_TPOT_TOKENS, O - 1) such ids
  gap p50/p99   every such gap, all requests together: a decode step, or a
                step stretched by another client's prefill beside it
"""
import asyncio
import random
import time

import load

PROBE_TOKENS = 16
MIN_TPOT_TOKENS = 16
# The row stops itself this long before the time budget's hard cut, so that
# its figures survive.
STOP_MARGIN_S = 3.0


class _Req:
    """One request of a client's loop: its record and its ids-carrying
    messages' (arrival, ids)."""

    __slots__ = ("client", "sent", "arrivals", "records")

    def __init__(self, client, sent):
        self.client, self.sent = client, sent
        self.arrivals, self.records = [], []

    def on_ids(self, t, n):
        self.arrivals.append((t, n))


def expected_request_s(probe, output_tokens, step_s):
    """E: the probe's TTFT + O x the step (step_s, else its TPOT); 0 when
    the probe gave nothing (the clients then start together)."""
    per_token = step_s or probe.tpot() or 0.0
    first = probe.ttft if probe.ttft is not None else 0.0
    return first + output_tokens * per_token


async def _measure(client, *, P, O, C, seconds, step_s, vocab, seed, stop_by):
    """The row's timeline (module docstring); returns its raw figures."""
    await client.open()
    clock = time.perf_counter
    lag = load.LoopLag()
    cpu0, t0 = time.process_time(), clock()
    rng = random.Random(seed)
    probe = []
    await client.one(client.request(load.random_prompts(rng, 1, P, vocab)[0],
                                    min(O, PROBE_TOKENS), False, 0), probe)
    expected = expected_request_s(probe[0], O, step_s)
    delays = [rng.random() * expected for _ in range(C)]
    t_loops = clock()
    t_stop = t_loops + max(delays) + seconds
    shortened = stop_by is not None and t0 + stop_by < t_stop
    if shortened:
        t_stop = t0 + stop_by
    reqs, in_flight = [], {}

    async def loop(i):
        crng = random.Random("%d/%d" % (seed, i))
        await asyncio.sleep(max(0.0, t_loops + delays[i] - clock()))
        failed = 0
        while clock() < t_stop:
            q = _Req(i, clock())
            reqs.append(q)
            in_flight[i] = q
            rec = await client.one(client.request(load.random_prompts(crng, 1, P, vocab)[0],
                                                  O, False, 0), q.records, on_ids=q.on_ids)
            del in_flight[i]
            failed = failed + 1 if rec.status != "OK" else 0
            if failed >= client.max_consecutive_errors:
                break  # the server refuses: the rest would fail alike

    tasks = [asyncio.ensure_future(loop(i)) for i in range(C)]
    planned = []
    try:
        await asyncio.wait(tasks, timeout=max(0.0, t_stop - clock()))
        t_end = clock()
        planned = list(in_flight.values())
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    wall = clock() - t0
    cpu = time.process_time() - cpu0
    lags = await lag.stop()
    return dict(probe=probe, reqs=reqs, planned=planned, delays=delays, expected_s=expected,
                t0=t0, t_loops=t_loops, t_stop=min(t_end, t_stop), shortened=shortened,
                m=dict(wall_s=wall, client_cpu_s=cpu, **lags))


def run_row(client, *, prompt_tokens, output_tokens, clients, seconds, step_s, vocab,
            seed, pids=None, hard_s=None):
    """One mixed row. step_s: cuda_bench's DecodeBatch step at B = clients
    (seconds) or None. The row stops itself STOP_MARGIN_S before hard_s
    (the time budget), which cuts whatever still runs. Returns the row dict
    (plus "records")."""
    P, O, C = prompt_tokens, output_tokens, clients
    stop_by = None if hard_s is None else max(0.0, hard_s - STOP_MARGIN_S)
    raw, t_row, cpu = load.run_timed(
        client, _measure(client, P=P, O=O, C=C, seconds=seconds, step_s=step_s,
                         vocab=vocab, seed=seed, stop_by=stop_by), hard_s, pids)
    row = dict(prompt_tokens=P, output_tokens_per_request=O, max_tokens=O, clients=C,
               concurrency=C, seconds=seconds, spec=False, k=0)
    if raw is None:
        row.update(requests=0, done=0, cut=C, errors={}, error_examples=[],
                   ttft_p50_ms=None, ttft_p99_ms=None, tpot_p50_ms=None, tpot_p99_ms=None,
                   tok_s=0.0, wall_s=time.perf_counter() - t_row, client_cpu_pct=None,
                   loop_lag_p99_ms=None, loop_lag_max_ms=None, client_limited=False,
                   records=[], note="cut at the time budget")
        return row
    row.update(_figures(raw, O))
    wall = raw["m"]["wall_s"]
    for name, secs in cpu.items():
        row["%s_cpu_pct" % name] = 100.0 * secs / wall if wall > 0 else None
    return row


def _ms(x):
    return None if x is None else 1e3 * x


def window_figures(reqs, w0, t_stop, output_tokens):
    """tok/s, TTFTs, per-request TPOTs and gaps of the window [w0, t_stop]
    (module docstring) from the requests' (sent, arrivals, record)."""
    span = t_stop - w0
    ids = sum(n for q in reqs for t, n in q.arrivals if w0 <= t <= t_stop)
    sent = [q for q in reqs if q.sent >= w0 and q.records]
    ttft = [q.records[0].ttft for q in sent if q.records[0].ttft is not None]
    need = max(1, min(MIN_TPOT_TOKENS, output_tokens - 1))
    tpots, gaps, ids_after = [], [], 0
    for q in reqs:
        a = q.arrivals
        mine = [(a[i][0] - a[i - 1][0], a[i][1]) for i in range(1, len(a))
                if w0 <= a[i][0] <= t_stop]
        gaps += [g for g, _ in mine]
        n = sum(k for _, k in mine)
        ids_after += n
        if n >= need:
            tpots.append(sum(g for g, _ in mine) / n)
    return {"window_s": span, "window_ids": ids,
            "tok_s": ids / span if span > 0 else 0.0,
            "requests_in_window": len(sent), "ttft": ttft,
            "ttft_censored": len(sent) - len(ttft), "tpots": tpots, "gaps": gaps,
            "ids_per_message": ids_after / len(gaps) if gaps else None}


def _figures(raw, O):
    probe = raw["probe"]
    recs = [q.records[0] for q in raw["reqs"] if q.records]
    planned = {id(q.records[0]) for q in raw["planned"] if q.records}
    out = load.count_statuses(probe + recs, planned)
    out["cancelled_at_end"] = len(planned)
    out["completed"] = sum(1 for r in recs if r.status == "OK")
    starts = {}
    for q in raw["reqs"]:
        starts.setdefault(q.client, q.sent)
    clients = len(raw["delays"])
    # W0: the last client's first send (none when one never sent: no window).
    w0 = max(starts.values()) if len(starts) == clients else raw["t_stop"]
    w = window_figures(raw["reqs"], w0, raw["t_stop"], O)
    p = probe[0]
    out.update(
        probe_ttft_ms=_ms(p.ttft), probe_tpot_ms=_ms(p.tpot()),
        expected_request_ms=_ms(raw["expected_s"]),
        delays_ms=[_ms(d) for d in raw["delays"]], window_start_s=w0 - raw["t0"],
        window_s=w["window_s"], window_ids=w["window_ids"], tok_s=w["tok_s"],
        window_shortened=raw["shortened"], requests_in_window=w["requests_in_window"],
        ttft_p50_ms=_ms(load.percentile(w["ttft"], 50)),
        ttft_p99_ms=_ms(load.percentile(w["ttft"], 99)), ttft_censored=w["ttft_censored"],
        tpot_p50_ms=_ms(load.percentile(w["tpots"], 50)),
        tpot_p99_ms=_ms(load.percentile(w["tpots"], 99)), tpot_requests=len(w["tpots"]),
        gap_p50_ms=_ms(load.percentile(w["gaps"], 50)),
        gap_p99_ms=_ms(load.percentile(w["gaps"], 99)),
        gap_max_ms=_ms(max(w["gaps"])) if w["gaps"] else None, window_gaps=len(w["gaps"]),
        window_ids_per_message=w["ids_per_message"])
    out.update(load.client_figures(raw["m"], out["done"]))
    out["output_tokens"] = sum(r.tokens for r in recs)
    records = []
    for role, rs in (("probe", probe), ("loop", recs)):
        for r in rs:
            j = r.to_json()
            j.update(role=role, start_s=r.start - raw["t0"], cancelled_by_row=id(r) in planned)
            records.append(j)
    out["records"] = records
    return out
