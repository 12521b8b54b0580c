"""Regression tests of issue 27's defects, with real processes (two workers on
the default model, which has a tokenizer, and one scheduler with metrics):

  1. REWIND after an empty continuation: the scheduler and the worker keep
     the same rewind point (the last prompt's end), before and after a
     rebuild of the session;
  4. cached_prompt_tokens is 0 for a turn whose session was rebuilt;
  8. unparseable requests and non-UTF-8 strings get INVALID_ARGUMENT naming
     the field; a duplicate request_id gets ABORTED;
 11. the metrics: the session gauges fall back to 0, refused prompts are not
     counted, the per-request time per output token, the model_name label;
 12. the session capacity minimum, response.text/ids false honoured, and the
     meaning of SessionInfo.mode beside last_gate_decision.
"""
import os
import signal

import types

import grpc
import pytest

import e2e_util as u

GET_SESSION = "specserve.v1.Sessions/GetSession"
OPEN_SESSION = "specserve.v1.Sessions/OpenSession"
WORKER_STATE = "specserve.worker.v1.Worker/GetSessionState"


@pytest.fixture(scope="module")
def cluster():
    c = u.Cluster(n_workers=2, worker_extra=[u.SPEC_ALWAYS_PAYS],
                  metrics=True)
    yield c
    c.stop()


@pytest.fixture(autouse=True)
def all_workers_up(cluster):
    """Each test starts with both workers alive (a test may kill one)."""
    for i, w in enumerate(cluster.workers):
        if w.popen.poll() is not None:
            cluster.restart_worker(i)
    u.wait_until(lambda: all(w.available for w in cluster.client.call(
        "specserve.v1.Admin/GetServerInfo").workers), timeout=15,
        what="workers available")
    yield


def _open(c, capacity=0):
    return c.call(OPEN_SESSION, capacity=capacity).session_id


def _tokens(c, text):
    return list(c.call("specserve.v1.Tokenization/Tokenize", text=text,
                       parse_special=True).ids)


def _turn(c, sid, text=None, ids=None, n=8, rewind=False, spec=False):
    req = {"session": {"session_id": sid,
                       "mode": "REWIND" if rewind else "APPEND"},
           "stopping": {"max_tokens": n, "ignore_eos": True},
           "speculation": {"enable": spec},
           "response": {"ids": True}}
    if text is not None:
        req["text"] = text
    if ids is not None:
        req["token_ids"] = {"ids": ids}
    r = u.generate_ok(c, req)
    assert len(r.ids) == n, r  # plain decode: no overshoot
    return r


def _in_step(cluster, sid, committed, rewind_pos):
    """GetSession says `committed` and `rewind_pos`; the worker holding the
    session holds as many rows, and its checkpoint is at the same place."""
    info = cluster.client.call(GET_SESSION, session_id=sid)
    assert u.enum_name(info, "residency") == "PARKED", info
    i = u.worker_index_by_address(cluster, info.worker)
    state = cluster.worker_client(i).call(WORKER_STATE, session_id=sid,
                                          owner=u.WORKER_OWNER)
    assert (info.committed_tokens, info.rewind_pos) == (committed, rewind_pos)
    assert (state.committed_len, state.rewind_pos) == (committed,
                                                       rewind_pos), state
    return i


def _kill(cluster, i):
    cluster.workers[i].signal(signal.SIGKILL)
    u.wait_until(lambda: not cluster.client.call(
        "specserve.v1.Admin/GetServerInfo").workers[i].available,
        timeout=10, what="scheduler marks worker %d unavailable" % i)


def _fresh(c, ids, n=8):
    """What a new session with exactly this history produces."""
    return _turn(c, _open(c), ids=ids, n=n).ids


def test_rewind_after_empty_continuation(cluster):
    """Item 1."""
    c = cluster.client
    sid = _open(c, capacity=64)
    p1 = _tokens(c, "def add(a, b):\n")
    s3 = _tokens(c, "    return a + b\n")
    out1 = _turn(c, sid, text="def add(a, b):\n").ids
    out2 = _turn(c, sid).ids  # empty continuation: the checkpoint stays
    _in_step(cluster, sid, len(p1) + 16, len(p1))
    r3 = _turn(c, sid, text="    return a + b\n", rewind=True)
    assert r3.final.usage.cached_prompt_tokens == len(p1)
    history = p1 + s3 + list(r3.ids)  # the reply REWIND dropped is gone
    holder = _in_step(cluster, sid, len(history), len(p1) + len(s3))
    assert list(r3.ids) == _fresh(c, p1 + s3)
    assert list(out1) + list(out2) == u.specgen(p1, 16, ignore_eos=True)

    # Rebuilt from exactly that history after its worker dies, by an empty
    # continuation: the rebuilt copy's checkpoint is the table's (the last
    # prompt's end, AdmitRequest.checkpoint_pos), so a REWIND still goes there.
    _kill(cluster, holder)
    out4 = _turn(c, sid).ids
    assert list(out4) == u.specgen(history, 8, ignore_eos=True)
    history += list(out4)
    _in_step(cluster, sid, len(history), len(p1) + len(s3))
    s5 = _tokens(c, "    return a - b\n")
    r5 = _turn(c, sid, text="    return a - b\n", rewind=True)
    assert list(r5.ids) == _fresh(c, p1 + s3 + s5)
    _in_step(cluster, sid, len(p1 + s3 + s5) + 8, len(p1 + s3 + s5))


def test_cached_prompt_tokens_after_rebuild(cluster):
    """Item 4."""
    c = cluster.client
    sid = _open(c)
    p1, p2, p3 = u.prompt_ids(71, 12), u.prompt_ids(72, 5), u.prompt_ids(73, 4)
    r1 = _turn(c, sid, ids=p1)
    assert r1.final.usage.cached_prompt_tokens == 0
    info = c.call(GET_SESSION, session_id=sid)
    _kill(cluster, u.worker_index_by_address(cluster, info.worker))
    # Rebuilt on the other worker by a prefill of its history: nothing of
    # this turn's prompt came from a cache.
    r2 = _turn(c, sid, ids=p2)
    assert r2.final.usage.cached_prompt_tokens == 0, r2
    history = p1 + list(r1.ids) + p2
    assert list(r2.ids) == u.specgen(history, 8, ignore_eos=True)
    # A normal resumed turn serves the whole history from the caches.
    history += list(r2.ids)
    r3 = _turn(c, sid, ids=p3)
    assert r3.final.usage.cached_prompt_tokens == len(history), r3


def _raw_generate(c, body):
    m = c.method(u.GENERATE)
    stub = c.channel.unary_stream(
        "/" + u.GENERATE, request_serializer=lambda b: b,
        response_deserializer=c.message_class(m.output_type).FromString)
    try:
        list(stub(body, timeout=u.RPC_TIMEOUT))
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details() or ""


def test_codes_and_messages(cluster):
    """Item 8 (the drain part excepted)."""
    c = cluster.client
    # Field 1 (text) holding two bytes that are not UTF-8; field 4
    # (stopping) holding field 2 (stop) likewise.
    bad_text = b"\x0a\x02\xc3\x28"
    bad_stop = b"\x0a\x01a" + b"\x22\x04\x12\x02\xc3\x28"
    for body, fragment in [
            (bad_text, "text is not valid UTF-8"),
            (bad_stop, "stopping.stop[0] is not valid UTF-8"),
            (b"\xff\xff\xff\xff", "is not a protobuf message of type "
                                  "specserve.v1.GenerateRequest")]:
        code, details = _raw_generate(c, body)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (body, code)
        assert fragment in details, details
    # The same path serves well-formed requests.
    ok = c.request(u.GENERATE)
    ok.text = "a"
    ok.stopping.max_tokens = 2
    assert _raw_generate(c, ok.SerializeToString())[0] == grpc.StatusCode.OK
    # Sessions and Tokenization parse their requests the same way.
    for method, body, fragment in [
            ("specserve.v1.Tokenization/Tokenize", bad_text,
             "text is not valid UTF-8"),
            (GET_SESSION, b"\x0a\x02\xc3\x28", "session_id is not valid"),
            (OPEN_SESSION, b"\xff\xff", "is not a protobuf message")]:
        call = c.channel.unary_unary("/" + method,
                                     request_serializer=lambda b: b,
                                     response_deserializer=lambda b: b)
        code, details = u.rpc_code(call, body, timeout=u.RPC_TIMEOUT)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (method, code)
        assert fragment in details, details

    # A duplicate request_id, like a second turn on a busy session, is
    # ABORTED; the id is free again once the first request ended.
    holder = u.Stream(c, {"token_ids": {"ids": u.prompt_ids(81, 8)},
                          "request_id": "dup-1",
                          "stopping": {"max_tokens": 3000,
                                       "ignore_eos": True}})
    holder.wait_tokens(1)
    r = u.generate(c, {"text": "x", "request_id": "dup-1",
                       "stopping": {"max_tokens": 2}})
    assert r.code == grpc.StatusCode.ABORTED, r
    assert "dup-1" in r.details and "already running" in r.details
    holder.cancel()
    holder.join()
    u.wait_until(lambda: u.metric(cluster.scheduler,
                                  "vllm:num_requests_running") == 0,
                 timeout=10, what="the first dup-1 request ended")
    u.generate_ok(c, {"text": "x", "request_id": "dup-1",
                      "stopping": {"max_tokens": 2}})


def _series(proc, prefix):
    return {k: v for k, v in u.scrape(proc).items() if k.startswith(prefix)}


def test_metrics(cluster):
    """Item 11."""
    c, proc = cluster.client, cluster.scheduler
    active = 'specserve_sessions{residency="active"}'
    # The active-session gauge goes back to 0 once the sessions are idle.
    st = u.Stream(c, {"token_ids": {"ids": u.prompt_ids(91, 8)},
                      "stopping": {"max_tokens": 3000, "ignore_eos": True}})
    st.wait_tokens(1)
    u.wait_until(lambda: u.scrape(proc).get(active, 0) >= 1, timeout=10,
                 what="an active session counted")
    st.cancel()
    st.join()
    u.wait_until(lambda: u.scrape(proc).get(active) == 0 and
                 u.metric(proc, "vllm:num_requests_running") == 0,
                 timeout=10, what="no active session once idle")

    # A prompt refused for the context is not counted as prompt tokens; an
    # admitted one is, once.
    before = u.metric(proc, "vllm:prompt_tokens_total")
    long_text = " ".join("w%d" % i for i in range(2500))
    assert len(_tokens(c, long_text)) > 4096
    r = u.generate(c, {"text": long_text, "stopping": {"max_tokens": 4}})
    assert r.code == grpc.StatusCode.INVALID_ARGUMENT, r
    assert u.metric(proc, "vllm:prompt_tokens_total") == before
    prompt = u.prompt_ids(92, 7)
    tpot = "vllm:time_per_output_token_seconds_count"
    itl = "vllm:inter_token_latency_seconds_count"
    per_request = "vllm:request_time_per_output_token_seconds_count"
    counts = {n: u.metric(proc, n) for n in (tpot, itl, per_request)}
    u.generate_ok(c, {"token_ids": {"ids": prompt},
                      "stopping": {"max_tokens": 40, "ignore_eos": True}})
    assert u.metric(proc, "vllm:prompt_tokens_total") == before + len(prompt)
    # The per-request mean is observed once per request; inter-token latency
    # (and vLLM's deprecated alias time_per_output_token) once per delivery.
    deltas = {n: u.metric(proc, n) - counts[n] for n in counts}
    assert deltas[per_request] == 1, deltas
    assert deltas[itl] >= 1 and deltas[tpot] == deltas[itl], deltas

    # Every vllm: series names the served model, as vLLM's do.
    model = os.path.basename(cluster.model.rstrip("/"))
    assert model == os.path.basename(
        c.call("specserve.v1.Admin/GetModelInfo").path.rstrip("/"))
    vllm = _series(proc, "vllm:")
    assert vllm and all('model_name="%s"' % model in k for k in vllm), [
        k for k in vllm if 'model_name="%s"' % model not in k][:5]


def test_session_options(cluster):
    """Item 12."""
    c = cluster.client
    # A capacity below one prompt token plus one round at the largest k is
    # refused (0 still means the server's default).
    for capacity in (1, 9):
        code, details = u.rpc_code(c.call, OPEN_SESSION, capacity=capacity)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, capacity
        assert "below the minimum of 10" in details, details
        r = u.generate(c, {"text": "a", "session": {"capacity": capacity},
                           "stopping": {"max_tokens": 1}})
        assert r.code == grpc.StatusCode.INVALID_ARGUMENT, r
        assert "session.capacity" in r.details
    assert c.call(OPEN_SESSION, capacity=10).capacity == 10
    assert c.call(OPEN_SESSION).capacity > 10

    # response.text false is honoured for a text prompt; stop strings still
    # apply to the text that is not sent.
    req = {"text": "def add(a, b):\n", "stopping": {"max_tokens": 24,
                                                    "ignore_eos": True}}
    full = u.generate_ok(c, dict(req, response={"ids": True}))
    assert full.text and len(full.ids) == 24
    quiet = u.generate_ok(c, dict(req, response={"text": False}))
    assert quiet.text == "" and quiet.ids == [] and quiet.deltas == 0
    assert quiet.final.usage.completion_tokens == 24
    ids_only = u.generate_ok(c, dict(req, response={"text": False,
                                                    "ids": True}))
    assert ids_only.text == "" and ids_only.ids == full.ids
    stop = full.text[len(full.text) // 2:][:3]
    assert stop.strip(), full.text
    cut = u.generate_ok(c, {"text": "def add(a, b):\n",
                            "stopping": {"max_tokens": 24, "ignore_eos": True,
                                         "stop": [stop]},
                            "response": {"text": False, "ids": True}})
    assert u.finish_name(cut) == "STOP", cut
    assert 0 < len(cut.ids) < len(full.ids)
    assert cut.ids == full.ids[:len(cut.ids)]
    # Likewise for token ids in and out, where text is off by default.
    by_ids = u.generate_ok(c, {"token_ids": {"ids": _tokens(c, req["text"])},
                               "stopping": {"max_tokens": 24,
                                            "ignore_eos": True,
                                            "stop": [stop]}})
    assert by_ids.text == "" and by_ids.ids == cut.ids

    # mode is what the caches can run; last_gate_decision what the latest
    # burst ran. A session whose turns ask for no speculation holds no draft
    # state (mode BATCHED, a fraction of the memory) ...
    sid = _open(c)
    prompt = u.prompt_ids(93, 6)
    first = _turn(c, sid, ids=prompt, spec=False)
    info = c.call(GET_SESSION, session_id=sid)
    assert u.enum_name(info, "mode") == "BATCHED", info
    assert u.enum_name(info.last_gate_decision, "mode") == "BATCHED"
    assert info.last_gate_decision.reason == "speculation not requested"
    # ... and a later request that asks for it promotes the session (its
    # copy rebuilt with draft state) and speculates, exactly.
    r = u.generate_ok(c, {"session": {"session_id": sid},
                          "stopping": {"max_tokens": 12, "ignore_eos": True},
                          "speculation": {"enable": True, "k": 2},
                          "response": {"spec_stats": True, "ids": True}})
    assert r.final.spec_stats.rounds > 0, r
    u.assert_matches_reference(
        prompt, types.SimpleNamespace(ids=list(first.ids) + list(r.ids)),
        len(first.ids) + 12, ignore_eos=True)
    info = c.call(GET_SESSION, session_id=sid)
    assert u.enum_name(info, "mode") == "SPECULATIVE"
    assert u.enum_name(info.last_gate_decision, "mode") == "SPECULATIVE"
