"""serve_bench's comparisons and tables: each served row beside the kernel
benchmark of the same run (tools/cuda_bench's JSON) and beside its bytes
floor.

Floors (all at the copy bandwidth cuda_bench measured in the same run,
bytes read + written, as PERF.md's):
  decode step of c sessions  (W + c * S(ctx)) / copy bandwidth, where W is the
      weight bytes a decode step reads (cuda_bench's decode_weight_bytes) and
      S(ctx) a session's state traffic per step: the fp32 delta-rule state and
      conv window of every linear-attention layer, read and written, plus the
      fp32 K and V rows of every full-attention layer read at context ctx
      (the mean context of a row: prompt + max_tokens / 2). At c = 64, ctx 40
      this is PERF.md's 71.6 GB (c) floor. The row's floor tok/s is
      c / that step time.
  prefill of P tokens  one pass of the trunk weights per rows_per_pass rows
      (cuda_bench's prefill passes: the row-invariant 64-row kernels) plus
      lm_head once: floor_ms * (passes * (W - lm) + lm) / W, cuda_bench's
      bytes floor, extended to any P.
"""
import math

import load


def _cfg(model):
    """The fields used here, from a ModelInfo dict or a config.json dict."""
    g = model.get
    types = g("layer_types")
    if types and isinstance(types[0], str):
        full = sum(1 for t in types if t in ("full_attention", "FULL_ATTENTION"))
    else:
        full = sum(1 for t in types or [] if t == 2)
    n = g("num_layers") or g("num_hidden_layers")
    return dict(
        layers=n, full=full, linear=n - full,
        vocab=g("vocab_size"), hidden=g("hidden_size"),
        kv_heads=g("num_key_value_heads"), head_dim=g("head_dim"),
        nk=g("linear_num_key_heads"), nv=g("linear_num_value_heads"),
        dk=g("linear_key_head_dim"), dv=g("linear_value_head_dim"),
        conv_k=g("linear_conv_kernel_dim"))


def session_step_bytes(model, ctx):
    """S(ctx): state bytes one session's decode step must move."""
    c = _cfg(model)
    rec = c["nv"] * c["dk"] * c["dv"] * 4
    conv = (2 * c["nk"] * c["dk"] + c["nv"] * c["dv"]) * (c["conv_k"] - 1) * 4
    kv = 2 * c["kv_heads"] * c["head_dim"] * 4 * ctx
    return c["linear"] * 2 * (rec + conv) + c["full"] * kv


def decode_floor_ms(bench, model, c, ctx):
    m = bench["model_27b"]
    b = m["decode_weight_bytes"] + c * session_step_bytes(model, ctx)
    return b / (bench["copy_gbs"] * 1e6)


def prefill_floor_ms(bench, model, p):
    m = bench["model_27b"]
    pre = m.get("prefill") or []
    rows = max((e["P"] / e["passes"] for e in pre), default=64)
    passes = math.ceil(p / rows)
    w = m["decode_weight_bytes"]
    c = _cfg(model)
    lm = 2.0 * c["vocab"] * c["hidden"]
    return m["floor_ms"] * (passes * (w - lm) + lm) / w


def bench_batch(bench, b):
    for e in (bench or {}).get("model_27b", {}).get("decode_batch", []):
        if e["B"] == b:
            return e
    return None


def bench_prefill(bench, p):
    for e in (bench or {}).get("model_27b", {}).get("prefill", []):
        if e["P"] == p:
            return e
    return None


def bench_long_context(bench, context, b):
    """cuda_bench's (h) row at (context, B), or None."""
    for e in (bench or {}).get("model_27b", {}).get("decode_long_context", []):
        if e["context"] == context and e["B"] == b:
            return e
    return None


def _ratio(a, b):
    return a / b if a is not None and b else None


def annotate_context(r, bench):
    """A context row beside (h) at its (context, B = c): the step and its
    state-inclusive floor, and the served TPOT p50 over each."""
    e = bench_long_context(bench, r["context"], r["concurrency"])
    if e:
        r["bench_step_ms"] = e["ms"]
        r["bench_state_floor_ms"] = e.get("state_floor_ms")
        r["bench_x_state_floor"] = e.get("x_state_floor")
        r["bench_attention_ms"] = e.get("attention_ms")
        r["tpot_over_bench"] = _ratio(r.get("tpot_p50_ms"), e["ms"])
        r["tpot_over_state_floor"] = _ratio(r.get("tpot_p50_ms"), e.get("state_floor_ms"))


def annotate_mixed(r, bench):
    """A mixed row beside the pure-decode step at B = clients: (c)'s
    DecodeBatch at a short context, and (h)'s at the prompt's context when
    it has that (context, B)."""
    c = r["concurrency"]
    e = bench_batch(bench, c)
    if e:
        r["bench_step_ms"] = e["greedy_ms"]
        r["tpot_over_bench"] = _ratio(r.get("tpot_p50_ms"), e["greedy_ms"])
        r["gap_p99_over_bench"] = _ratio(r.get("gap_p99_ms"), e["greedy_ms"])
    h = bench_long_context(bench, r["prompt_tokens"], c)
    if h:
        r["bench_long_step_ms"] = h["ms"]
        r["tpot_over_long_step"] = _ratio(r.get("tpot_p50_ms"), h["ms"])


def annotate(result):
    """Adds the bench and floor figures to every row of `result` (in
    place)."""
    bench, model = result.get("cuda_bench"), result.get("model") or {}
    usable = bool(bench and "model_27b" in bench and bench.get("copy_gbs")
                  and model.get("hidden_size"))
    plain = {r["concurrency"]: r for r in result["rows"] if r["kind"] == "decode"
             and not r["spec"] and r.get("workers", 1) == 1}
    for r in result["rows"]:
        n = r.get("workers", 1)
        if r["kind"] == "decode" and n > 1:
            # Scaling: beside N x the one-worker row at the same per-worker
            # concurrency, and N x that row's floor.
            one = plain.get(r["concurrency"] // n)
            if one:
                r["one_worker_tok_s"] = one["tok_s"]
                r["n_x_one_tok_s"] = n * one["tok_s"]
                if one["tok_s"] > 0:
                    r["over_n_x_one"] = r["tok_s"] / r["n_x_one_tok_s"]
                if one.get("floor_tok_s"):
                    r["floor_tok_s"] = n * one["floor_tok_s"]
        elif r["kind"] == "decode":
            c = r["concurrency"]
            if not r["spec"]:
                e = bench_batch(bench, c)
                if e:
                    r["bench_step_ms"] = e["greedy_ms"]
                    r["bench_tok_s"] = c * 1e3 / e["greedy_ms"]
                    r["served_over_bench"] = r["tok_s"] / r["bench_tok_s"]
                if usable:
                    ctx = r["prompt_tokens"] + r["max_tokens"] / 2.0
                    f = decode_floor_ms(bench, model, c, ctx)
                    r["floor_step_ms"] = f
                    r["floor_tok_s"] = c * 1e3 / f
                    r["served_over_floor"] = r["tok_s"] / r["floor_tok_s"]
                if c == 1 and bench and "model_27b" in bench:
                    g = bench["model_27b"].get("decode_greedy_ms")
                    if g and r.get("tpot_p50_ms"):
                        r["bench_greedy_step_ms"] = g
                        r["tpot_over_greedy_step"] = r["tpot_p50_ms"] / g
            else:
                p = plain.get(c)
                if p and p["tok_s"] > 0:
                    r["plain_tok_s"] = p["tok_s"]
                    r["x_plain"] = r["tok_s"] / p["tok_s"]
        elif r["kind"] == "json":
            # Beside the unconstrained plain row of the same c (same run).
            p = plain.get(r["concurrency"])
            if p:
                r["plain_tpot_p50_ms"] = p.get("tpot_p50_ms")
                r["plain_tok_s"] = p["tok_s"]
                r["tpot_over_plain"] = _ratio(r.get("tpot_p50_ms"), p.get("tpot_p50_ms"))
        elif r["kind"] == "context":
            annotate_context(r, bench)
        elif r["kind"] == "mixed":
            annotate_mixed(r, bench)
        elif r["kind"] == "ttft":
            e = bench_prefill(bench, r["prompt_tokens"])
            if e:
                r["bench_prefill_ms"] = e["ms"]
                if r.get("ttft_p50_ms"):
                    r["ttft_over_bench"] = r["ttft_p50_ms"] / e["ms"]
            if usable:
                r["prefill_floor_ms"] = prefill_floor_ms(bench, model, r["prompt_tokens"])
            if r.get("ttft_p50_ms"):
                r["prefill_tok_s"] = r["prompt_tokens"] * 1e3 / r["ttft_p50_ms"]
    return result


def _f(x, fmt="%.1f"):
    return "-" if x is None else fmt % x


def _mib(x):
    return _f(None if x is None else x / 2.0 ** 20, "%.1f")


def _errs(r):
    e = r.get("errors") or {}
    text = ", ".join("%s %d" % kv for kv in sorted(e.items())) or "0"
    if r.get("cut"):
        text += " (%d cut)" % r["cut"]
    return text


def _table(header, lines):
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(["---"] * len(header)) + " |"]
    out += ["| " + " | ".join(cells) + " |" for cells in lines]
    return out + [""]


def _cpu(r):
    mem = r.get("gpu_memory_peak_mib")
    return [_f(r.get("client_cpu_pct"), "%.0f%%"), _f(r.get("scheduler_cpu_pct"), "%.0f%%"),
            _f(r.get("worker_cpu_pct"), "%.0f%%"),
            _f(None if mem is None else mem / 1024.0, "%.1f")]


_CPU_HEAD = ["client CPU", "sched CPU", "worker CPU", "GPU GiB"]


def context_section(rows):
    """The long-context decode table (context rows), as lines."""
    cx = [r for r in rows if r["kind"] == "context"]
    if not cx:
        return []
    out = ["## Decode at long contexts (c streams of P-token prompts decoding together)", ""]
    out += _table(
        ["context", "c", "done", "errors", "TTFT p50", "TTFT max", "TPOT p50", "TPOT p99",
         "gap p99", "decode tok/s", "ctx mean", "bench step ms (h)", "state floor ms (h)",
         "TPOT / bench step", "TPOT / state floor"] + _CPU_HEAD,
        [[str(r["context"]), str(r["concurrency"]), str(r["done"]), _errs(r),
          _f(r.get("ttft_p50_ms")), _f(r.get("ttft_max_ms")), _f(r.get("tpot_p50_ms"), "%.2f"),
          _f(r.get("tpot_p99_ms"), "%.2f"), _f(r.get("gap_p99_ms"), "%.2f"), _f(r.get("tok_s")),
          _f(r.get("ctx_mean"), "%.0f"), _f(r.get("bench_step_ms"), "%.2f"),
          _f(r.get("bench_state_floor_ms"), "%.2f"), _f(r.get("tpot_over_bench"), "%.3f"),
          _f(r.get("tpot_over_state_floor"), "%.3f")] + _cpu(r) for r in cx])
    out.append("TPOT (ms): per stream over the %d ids after the last stream's first token "
               "(all c sessions in the batch; the gap that spans that token left out), "
               "p50/p99 over the streams; decode tok/s: the ids of that window / its length; "
               "ctx mean: the context the window decoded at. bench step, state floor: "
               "cuda_bench's (h) DecodeBatch step at (context, B = c) and its state-inclusive "
               "floor (- when (h) has no such row). Requests: max_tokens %d, cancelled by the "
               "row once every stream has its window." % (
                   cx[0]["window_tokens"], cx[0]["request_max_tokens"]))
    for r in cx:
        why = [w for w, bad in (
            ("%d stream(s) ended before the window closed (fewer than c in the batch)" %
             r.get("streams_ended_early", 0), r.get("streams_ended_early")),
            ("%d stream(s) had fewer than %d ids in the window" % (
                r.get("streams_short", 0), r["window_tokens"]), r.get("streams_short")),
            ("%d stream(s) never had a first token" % r.get("streams_without_first_token", 0),
             r.get("streams_without_first_token")),
            ("messages carried %.2f ids on average in the window: TPOT and gaps are per "
             "message" % (r.get("window_ids_per_message") or 0),
             (r.get("window_ids_per_message") or 1) > 1.05)) if bad]
        if why:
            out.append("NOTE (context %d, c %d): %s." % (r["context"], r["concurrency"],
                                                       "; ".join(why)))
    return out + [""]


def mixed_section(rows):
    """The mixed closed-loop table (mixed rows), as lines."""
    mx = [r for r in rows if r["kind"] == "mixed"]
    if not mx:
        return []
    out = ["## Mixed closed loop (clients looping over P-token prompts and O output tokens, "
           "starts staggered)", ""]
    out += _table(
        ["prompt", "output", "clients", "done (+cancelled at end)", "errors", "tok/s",
         "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "gap p99", "bench step ms (B=clients)",
         "TPOT / step", "gap p99 / step", "(h) step ms (P, B)", "TPOT / (h) step"] + _CPU_HEAD,
        [[str(r["prompt_tokens"]), str(r["output_tokens_per_request"]), str(r["clients"]),
          "%d (+%d)" % (r.get("completed", 0), r.get("cancelled_at_end", 0)), _errs(r),
          _f(r.get("tok_s")), _f(r.get("ttft_p50_ms")), _f(r.get("ttft_p99_ms")),
          _f(r.get("tpot_p50_ms"), "%.2f"), _f(r.get("tpot_p99_ms"), "%.2f"),
          _f(r.get("gap_p99_ms"), "%.2f"), _f(r.get("bench_step_ms"), "%.2f"),
          _f(r.get("tpot_over_bench"), "%.3f"), _f(r.get("gap_p99_over_bench"), "%.3f"),
          _f(r.get("bench_long_step_ms"), "%.2f"), _f(r.get("tpot_over_long_step"), "%.3f")]
         + _cpu(r) for r in mx])
    out.append("Figures over the window from the last client's first send to the row's stop "
               "(every client looping; in ms): tok/s = ids arriving in it / its length; TTFT of "
               "the requests sent in it; TPOT per request over its gaps in it (the first "
               "token's wait excluded), p50/p99 over requests; gap: between consecutive "
               "id-carrying messages of one request, all requests. bench step: cuda_bench's "
               "(c) DecodeBatch step at B = clients (a short context, greedy); (h) step: its "
               "(h) step at (context P, B = clients) when it has one.")
    for r in mx:
        out.append("(prompt %d, output %d, clients %d): window %s s, expected request %s s "
                   "(the starts spread over it), %d requests sent in the window (%d without a "
                   "first token by the stop), %d with a TPOT." % (
                       r["prompt_tokens"], r["output_tokens_per_request"], r["clients"],
                       _f(r.get("window_s")), _f(None if r.get("expected_request_ms") is None
                                                 else r["expected_request_ms"] / 1e3, "%.2f"),
                       r.get("requests_in_window", 0), r.get("ttft_censored", 0),
                       r.get("tpot_requests", 0)))
        why = [w for w, bad in (
            ("the window was shortened by the time budget", r.get("window_shortened")),
            ("messages carried %.2f ids on average in the window: TPOT and gaps are per "
             "message" % (r.get("window_ids_per_message") or 0),
             (r.get("window_ids_per_message") or 1) > 1.05)) if bad]
        if why:
            out.append("NOTE (prompt %d, clients %d): %s." % (r["prompt_tokens"], r["clients"],
                                                            "; ".join(why)))
    return out + [""]


def tables(result):
    """The markdown report (str)."""
    out = []
    meta = result.get("meta", {})
    out.append("# serve_bench (%s)" % meta.get("mode", "?"))
    out.append("")
    model = result.get("model") or {}
    out.append("model: %s (%s, %s parameters, %.2f GB weights, vocab %s); device %s; "
               "scheduler --max_running %s --burst_tokens %s" % (
                   model.get("path", "?"), model.get("dtype", "?"),
                   model.get("parameter_count", "?"),
                   (model.get("weight_bytes") or 0) / 1e9, model.get("vocab_size", "?"),
                   meta.get("device", "?"), meta.get("max_running", "?"),
                   meta.get("burst_tokens", "default")))
    b = result.get("cuda_bench")
    if b and "model_27b" in b:
        m = b["model_27b"]
        out.append("cuda_bench (%s): %s, copy %.0f GB/s; decode weight bytes %.2f GB, "
                   "floor %.2f ms; greedy decode step %.2f ms" % (
                       result.get("cuda_bench_note") or "same run",
                       b.get("device", "?"), b["copy_gbs"], m["decode_weight_bytes"] / 1e9,
                       m["floor_ms"], m.get("decode_greedy_ms") or float("nan")))
    else:
        out.append("cuda_bench: %s" % (result.get("cuda_bench_note") or "not run"))
    ck = result.get("checkpoint") or {}
    if ck:
        out.append("checkpoint: %s, %.2f GB, %s" % (
            ck.get("dir"), (ck.get("bytes") or 0) / 1e9,
            "kept from an earlier run" if ck.get("kept") else
            "written in %.1f s on %s" % (ck.get("seconds") or 0, ck.get("device", "?"))))
    out.append("")
    rows = result["rows"]

    def table(header, lines):
        out.append("| " + " | ".join(header) + " |")
        out.append("| " + " | ".join(["---"] * len(header)) + " |")
        for cells in lines:
            out.append("| " + " | ".join(cells) + " |")
        out.append("")

    def common(r):
        return [str(r["concurrency"]), str(r["done"]), _errs(r), _f(r["tok_s"]),
                _f(r["tpot_p50_ms"], "%.2f"), _f(r["tpot_p99_ms"], "%.2f"),
                _f(r["ttft_p50_ms"]), _f(r["ttft_p99_ms"])]

    def cpu(r):
        mem = r.get("gpu_memory_peak_mib")
        return [_f(r.get("client_cpu_pct"), "%.0f%%"), _f(r.get("scheduler_cpu_pct"), "%.0f%%"),
                _f(r.get("worker_cpu_pct"), "%.0f%%"),
                _f(None if mem is None else mem / 1024.0, "%.1f")]

    head = ["c", "done", "errors", "tok/s", "TPOT p50", "TPOT p99", "TTFT p50", "TTFT p99"]
    tail_ = ["client CPU", "sched CPU", "worker CPU", "GPU GiB"]
    dec = [r for r in rows if r["kind"] == "decode" and not r["spec"]
           and r.get("workers", 1) == 1]
    if dec:
        out.append("## Plain decode (speculation off), %d output tokens per request, "
                   "%d-token prompts" % (dec[0]["max_tokens"], dec[0]["prompt_tokens"]))
        out.append("")
        table(head + ["bench step ms (B=c)", "bench tok/s", "served/bench", "floor tok/s",
                      "served/floor"] + tail_,
              [common(r) + [_f(r.get("bench_step_ms"), "%.2f"), _f(r.get("bench_tok_s")),
                            _f(r.get("served_over_bench"), "%.3f"), _f(r.get("floor_tok_s")),
                            _f(r.get("served_over_floor"), "%.3f")] + cpu(r) for r in dec])
        one = [r for r in dec if r["concurrency"] == 1 and r.get("bench_greedy_step_ms")]
        if one:
            r = one[0]
            out.append("c = 1: TPOT p50 %.2f ms against cuda_bench's greedy decode step "
                       "%.2f ms (%.3fx)" % (r["tpot_p50_ms"], r["bench_greedy_step_ms"],
                                            r["tpot_over_greedy_step"]))
            out.append("")
    scaled = [r for r in rows if r["kind"] == "decode" and r.get("workers", 1) > 1]
    if scaled:
        n = scaled[0]["workers"]
        out.append("## Plain decode over %d workers, beside %d x one worker at the same "
                   "per-worker concurrency" % (n, n))
        out.append("")
        table(["c per worker"] + head + ["1 worker tok/s", "N x 1 worker", "N workers / (N x 1)",
                                         "floor tok/s"] + tail_,
              [[str(r["concurrency"] // n)] + common(r) +
               [_f(r.get("one_worker_tok_s")), _f(r.get("n_x_one_tok_s")),
                _f(r.get("over_n_x_one"), "%.3f"), _f(r.get("floor_tok_s"))] + cpu(r)
               for r in scaled])
    spec = [r for r in rows if r["kind"] == "decode" and r["spec"]]
    if spec:
        out.append("## Speculative (speculation enable, k = %d), same load" % spec[0]["k"])
        out.append("")
        table(head + ["plain tok/s", "x plain", "acceptance", "tokens/round", "demoted"] + tail_,
              [common(r) + [_f(r.get("plain_tok_s")), _f(r.get("x_plain"), "%.3f"),
                            _f(r.get("acceptance"), "%.3f"),
                            _f(r.get("tokens_per_round"), "%.2f"),
                            str(r["demoted_requests"])] + cpu(r) for r in spec])
    js = [r for r in rows if r["kind"] == "json"]
    if js:
        out.append("## Structured output: greedy decode constrained to a JSON schema "
                   "(load.JSON_ROW_SCHEMA), beside plain decode at the same c")
        out.append("")
        table(head + ["plain TPOT p50", "TPOT / plain (bar 1.05)", "plain tok/s",
                      "finished"] + tail_,
              [common(r) + [_f(r.get("plain_tpot_p50_ms"), "%.2f"),
                            _f(r.get("tpot_over_plain"), "%.3f"), _f(r.get("plain_tok_s")),
                            ", ".join(r.get("finish") or [])] + cpu(r)
               for r in js])
    tt = [r for r in rows if r["kind"] == "ttft"]
    if tt:
        out.append("## Time to first token (one request at a time, max_tokens 1)")
        out.append("")
        table(["prompt", "done", "errors", "TTFT p50", "TTFT p99", "prefill tok/s",
               "bench prefill ms", "TTFT/bench", "bytes floor ms", "GPU GiB"],
              [[str(r["prompt_tokens"]), str(r["done"]), _errs(r), _f(r["ttft_p50_ms"]),
                _f(r["ttft_p99_ms"]), _f(r.get("prefill_tok_s"), "%.0f"),
                _f(r.get("bench_prefill_ms")), _f(r.get("ttft_over_bench"), "%.3f"),
                _f(r.get("prefill_floor_ms")), cpu(r)[3]] for r in tt])
    pl = [r for r in rows if r["kind"] == "prefill_load"]
    if pl:
        step_bar, ttft_bar = pl[0]["step_bar"], pl[0]["ttft_bar"]
        out.append("## Prefill under load (one prompt sent, max_tokens 1, while plain "
                   "streams decode)")
        out.append("")
        out.append("Bars: the streams' p99 inter-token gap during the prefill <= %g x their "
                   "solo step, and the prompt's TTFT under load <= %g x its solo TTFT." % (
                       step_bar, ttft_bar))
        out.append("")

        def bar(x, limit):
            return "-" if x is None else "%.2f (%s)" % (x, "ok" if x <= limit else "OVER")

        table(["prompt", "streams", "errors", "solo step ms", "gap p50", "gap p99", "gap max",
               "p99 gap / step (bar <= %g)" % step_bar, "TTFT under load", "solo TTFT",
               "TTFT ratio (bar <= %g)" % ttft_bar, "stream tokens in prefill (min)",
               "GPU GiB"],
              [[str(r["prompt_tokens"]), str(r["streams"]), _errs(r),
                _f(r.get("solo_step_ms"), "%.2f"), _f(r.get("gap_p50_ms"), "%.2f"),
                _f(r.get("gap_p99_ms"), "%.2f"), _f(r.get("gap_max_ms"), "%.2f"),
                bar(r.get("gap_p99_over_step"), step_bar), _f(r.get("ttft_load_ms")),
                _f(r.get("solo_ttft_ms")), bar(r.get("ttft_over_solo"), ttft_bar),
                "%s (%s)" % (r.get("prefill_stream_tokens", "-"),
                             r.get("prefill_stream_tokens_min", "-")), cpu(r)[3]]
               for r in pl])
        out.append("Gap: between two consecutive id-carrying messages of one stream "
                   "(a message of n ids is one gap), in ms. Solo step: the median gap "
                   "arriving in the %g s before the send. The gaps during the prefill: "
                   "those overlapping the send .. its first token + one solo step. Solo TTFT: "
                   "the median of %d requests alone. Streams: %d-token prompts, "
                   "max_tokens %d, cancelled by the row once the prefill is done." % (
                       pl[0]["baseline_s"], pl[0]["solo_repeats"],
                       pl[0]["stream_prompt_tokens"], pl[0]["stream_max_tokens"]))
        for r in pl:
            why = [w for w, bad in (
                ("the streams never reached a steady state (one ended first)",
                 not r.get("steady", True)),
                ("%d stream(s) ended before the row was done with them" %
                 r.get("streams_ended_early", 0), r.get("streams_ended_early")),
                ("a stream's last message came before the window's end: gaps are missing",
                 r.get("window_covered") is False),
                ("messages carried %.2f ids on average during the prefill: gaps are per "
                 "message" % (r.get("window_tokens_per_message") or 0),
                 (r.get("window_tokens_per_message") or 1) > 1.05)) if bad]
            if why:
                out.append("NOTE (prompt %d): %s." % (r["prompt_tokens"], "; ".join(why)))
        out.append("")
    sp = [r for r in rows if r["kind"] == "shared_prefix"]
    if sp:
        out.append("## Shared prefix (one request alone, then N at once that share its "
                   "P-token prefix, each with its own suffix)")
        out.append("")
        out.append("Bars: the N's TTFT p50 <= %g ms; cached_prompt_tokens >= P for every one "
                   "of the N (with first = suffix they resume from a prefix checkpoint the "
                   "worker saved inside the first prompt, at a multiple of "
                   "--prefix_checkpoint_interval); held once: the worker's device bytes "
                   "per request of the N < the prefix's K/V bytes." % sp[0]["ttft_bar_ms"])
        out.append("")

        def ok(flag, text):
            return text if flag is None else "%s (%s)" % (text, "ok" if flag else "OVER")

        def cached(r):
            if r.get("cached_min") is None:
                return ok(r.get("cached_ok"), "-")
            return ok(r.get("cached_ok"), "%d / %g / %d (%d of %d >= %d)" % (
                r["cached_min"], r["cached_median"], r["cached_max"],
                r["cached_at_target"], r["clients"], r["cached_target"]))

        def held(r):
            if r.get("per_request_bytes") is None:
                return "-"
            return ok(r.get("held_once"), "%s MiB, %s x prefix K/V%s" % (
                _mib(r["per_request_bytes"]), _f(r.get("per_request_over_prefix_kv"), "%.2f"),
                "" if r.get("per_request_clean") else " (not clean)"))

        table(["prefix P", "suffix", "first", "N", "errors", "first TTFT", "first cached",
               "TTFT p50 (bar <= %g)" % sp[0]["ttft_bar_ms"], "TTFT p99", "TTFT max",
               "cached min / median / max (bar >= P)", "source MiB", "per request (held once)",
               "parked per request MiB", "prefix K/V MiB",
               "worker MiB before / first / peak / after", "GPU GiB"],
              [[str(r["prefix_tokens"]), str(r["suffix_tokens"]), r["first"],
                str(r["clients"]), _errs(r), _f(r.get("first_ttft_ms")),
                _f(r.get("first_cached_prompt_tokens"), "%d"),
                ok(r.get("ttft_ok"), _f(r.get("ttft_p50_ms"))), _f(r.get("ttft_p99_ms")),
                _f(r.get("ttft_max_ms")), cached(r),
                _mib(r.get("source_bytes")) + ("" if r.get("source_bytes") is None else
                                               " (%s)" % r.get("source_from")),
                held(r), _mib(r.get("after_per_session_bytes")), _mib(r.get("prefix_kv_bytes")),
                " / ".join(_mib((r.get("memory") or {}).get(k, {}).get("used"))
                           for k in ("before", "after_first")) + " / " +
                _mib(r.get("peak_used_bytes")) + " / " +
                _mib((r.get("memory") or {}).get("after", {}).get("used")),
                cpu(r)[3]] for r in sp])
        out.append("TTFT in ms. first: the first request's prompt (suffix: the prefix + its "
                   "own suffix; prefix: the prefix alone), max_tokens %d, alone; the N: "
                   "max_tokens %d, sent at once once it has ended. Memory: the worker's "
                   "GetWorkerInfo memory_used_bytes (device bytes of its sessions' caches "
                   "and checkpoints; no RPC gives one session's bytes). source = after the "
                   "first - before (parked), or while it ran when the cache released an "
                   "older session as it parked (running); per request = (peak - after the "
                   "first) / the sessions added, at the sample with the most sessions during "
                   "the N; parked per request = (after - after the first) / the sessions "
                   "added; prefix K/V = "
                   "P x full-attention layers x 2 x kv heads x head dim x %d bytes (%s)." % (
                       sp[0]["first_max_tokens"], sp[0]["max_tokens"],
                       sp[0]["kv_element_bytes"], sp[0].get("kv_dtype_note") or "?"))
        for r in sp:
            why = [w for w, bad in (
                ("the first request's session count delta was %s, not 1 (a cache-owned "
                 "session was released or offloaded meanwhile) and no sample caught it "
                 "running: source bytes are net" % r.get("source_sessions_delta"),
                 r.get("source_clean") is False),
                ("the peak sample saw %s of %d sessions added, %s of the N ended: per-request "
                 "bytes are net" % (r.get("peak_sessions_added"), r["clients"],
                                    r.get("peak_ended_before")),
                 r.get("per_request_clean") is False),
                ("worker memory unreadable: %s" % r.get("memory_error"),
                 r.get("memory_error")),
                ("the first request got cached_prompt_tokens %s (expected 0)" %
                 r.get("first_cached_prompt_tokens"), r.get("first_cached_prompt_tokens"))) if bad]
            if why:
                out.append("NOTE (P %d, first %s): %s." % (r["prefix_tokens"], r["first"],
                                                         "; ".join(why)))
        out.append("")
    out += context_section(rows)
    out += mixed_section(rows)
    for r in result.get("restarts") or []:
        out.append("servers restarted " + r)
        out.append("")
    skipped = result.get("skipped") or []
    if skipped:
        out.append("skipped: " + "; ".join(skipped))
        out.append("")
    limited = [r for r in rows if r.get("client_limited")]
    if limited:
        out.append("WARNING: the client may have limited %d row(s) (CPU > %.0f%% of a core or "
                   "loop lag p99 > %.0f ms): %s" % (
                       len(limited), load.CLIENT_CPU_LIMIT_PCT, load.LOOP_LAG_LIMIT_MS, ", ".join(
                       "%s c=%s" % (r["kind"] + ("/spec" if r.get("spec") else ""),
                                    r.get("concurrency")) for r in limited)))
    else:
        out.append("client: kept up in every row that ran (CPU <= %.0f%% of one core, loop "
                   "lag p99 <= %.0f ms; worst %.0f%%, %.2f ms)" % (
                       load.CLIENT_CPU_LIMIT_PCT, load.LOOP_LAG_LIMIT_MS,
                       max([r.get("client_cpu_pct") or 0 for r in rows
                            if r["done"] and r["wall_s"] >= 1.0] or [0]),
                       max([r.get("loop_lag_p99_ms") or 0 for r in rows
                            if r["done"] and r["wall_s"] >= 1.0] or [0])))
    total_err = sum(sum((r.get("errors") or {}).values()) for r in rows)
    out.append("requests: %d done, %d errors, %d cut at the time budget" % (
        sum(r["done"] for r in rows), total_err, sum(r.get("cut") or 0 for r in rows)))
    for r in rows:
        for e in r.get("error_examples") or []:
            out.append("  error (%s c=%s): %s" % (r["kind"], r.get("concurrency"), e))
    return "\n".join(out) + "\n"
