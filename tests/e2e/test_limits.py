"""docs/RELIABILITY.md rows 5, 6 and 7: overload (bounded queue, fast
RESOURCE_EXHAUSTED before tokenizing, admitted requests complete, memory
flat); context overflow (INVALID_ARGUMENT / OUT_OF_RANGE / finish
CONTEXT_FULL, never a row past capacity); bad ids and parameters (a clear
status, nothing reaches a worker, concurrent requests unaffected).

One worker shared by two schedulers: `small` admits one running and one
queued request; the default one runs everything else."""
import concurrent.futures
import time

import grpc
import pytest
from google.protobuf import json_format

import e2e_util as u

P1 = u.prompt_ids(41, 6)
P2 = u.prompt_ids(42, 9)
VOCAB = 6144
CONTEXT = 4096


@pytest.fixture(scope="module")
def cluster():
    c = u.Cluster(n_workers=1, worker_extra=[u.SPEC_ALWAYS_PAYS])
    c.small_proc = c.add_scheduler(
        [c.workers[0].address], ["--max_running=1", "--max_queued=1"],
        metrics=True)
    c.small = c.client_for(c.small_proc)
    yield c
    c.stop()


@pytest.fixture(autouse=True)
def idle_worker(cluster):
    yield
    u.wait_worker_idle(cluster, 0, sessions=0)


# ---------------------------------------------------------------------------
# Row 5: overload


def test_overload_is_refused_fast_and_admitted_requests_complete(cluster):
    c, proc = cluster.small, cluster.small_proc
    holder = u.Stream(c, {"token_ids": {"ids": P1},
                          "stopping": {"max_tokens": 2500,
                                       "ignore_eos": True}})
    holder.wait_tokens(1)
    queued = u.Stream(c, {"token_ids": {"ids": P2},
                          "stopping": {"max_tokens": 16}})
    u.wait_until(lambda: u.metric(proc, "vllm:num_requests_waiting") == 1,
                 what="one request queued")
    tokenized = u.metric(proc, "vllm:prompt_tokens_total")
    # 10x the capacity (1 running + 1 queued), half of them with a huge
    # text that would take a while to tokenize.
    huge = "def f(x):\n    return x\n" * 150000  # 3.6 MB
    reqs = [{"text": huge, "stopping": {"max_tokens": 4}} if i % 2 else
            {"token_ids": {"ids": P1}, "stopping": {"max_tokens": 4}}
            for i in range(20)]
    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        results = list(pool.map(lambda r: u.generate(c, r, timeout=30),
                                reqs))
    for r in results:
        assert r.code == grpc.StatusCode.RESOURCE_EXHAUSTED, r
        assert "retry after" in r.details, r.details
    # Refused before tokenizing: the tokenizer never saw them.
    assert u.metric(proc, "vllm:prompt_tokens_total") == tokenized
    # The admitted requests run to completion, exactly.
    h = holder.join()
    # Refused at once, not queued behind the running request: every refusal
    # came back while the holder was still generating.
    assert all(r.ended_at < h.ended_at for r in results)
    assert h.ok and u.finish_name(h) == "LENGTH" and len(h.ids) == 2500, h
    assert h.ids[:64] == u.specgen(P1, 64, ignore_eos=True)
    q = queued.join()
    assert q.ok, q
    u.assert_matches_reference(P2, q, 16)
    # Memory flat: nothing left behind on the worker.
    assert u.wait_worker_idle(cluster, 0, sessions=0).memory_used_bytes == 0


# ---------------------------------------------------------------------------
# Row 6: context overflow


def _status(r):
    return r.code, r.details


def test_prompt_over_context_is_invalid(cluster):
    c = cluster.client
    r = u.generate(c, {"token_ids": {"ids": [7] * (CONTEXT + 1)}})
    assert r.code == grpc.StatusCode.INVALID_ARGUMENT, r
    assert "context" in r.details and str(CONTEXT) in r.details
    # The same with text: the check runs after tokenizing.
    text = " ".join("w%d" % i for i in range(3000))
    n = len(c.call("specserve.v1.Tokenization/Tokenize", text=text).ids)
    assert n > CONTEXT
    r = u.generate(c, {"text": text})
    assert r.code == grpc.StatusCode.INVALID_ARGUMENT, r
    assert "prompt (%d tokens)" % n in r.details, r.details


def test_prompt_plus_max_tokens_over_context_is_invalid(cluster):
    c = cluster.client
    r = u.generate(c, {"token_ids": {"ids": [7] * 4000},
                       "stopping": {"max_tokens": 200}})
    assert r.code == grpc.StatusCode.INVALID_ARGUMENT, r
    assert "max_tokens (200)" in r.details and str(CONTEXT) in r.details
    text = " ".join("w%d" % i for i in range(1000))
    n = len(c.call("specserve.v1.Tokenization/Tokenize", text=text).ids)
    assert n < CONTEXT
    r = u.generate(c, {"text": text,
                       "stopping": {"max_tokens": CONTEXT - n + 1}})
    assert r.code == grpc.StatusCode.INVALID_ARGUMENT, r
    assert "exceeds the model context" in r.details


def test_session_turn_over_capacity_is_out_of_range(cluster):
    c = cluster.client
    sid = c.call("specserve.v1.Sessions/OpenSession", capacity=64).session_id
    first = u.generate_ok(c, {"token_ids": {"ids": u.prompt_ids(43, 30)},
                              "session": {"session_id": sid},
                              "stopping": {"max_tokens": 10,
                                           "ignore_eos": True}})
    committed = 30 + len(first.ids)
    assert c.call("specserve.v1.Sessions/GetSession",
                  session_id=sid).committed_tokens == committed
    r = u.generate(c, {"token_ids": {"ids": u.prompt_ids(44, 30)},
                       "session": {"session_id": sid},
                       "stopping": {"max_tokens": 10}})
    assert r.code == grpc.StatusCode.OUT_OF_RANGE, r
    assert "committed %d" % committed in r.details, r.details
    assert "capacity 64" in r.details, r.details
    # Nothing changed; a turn that fits still works.
    info = c.call("specserve.v1.Sessions/GetSession", session_id=sid)
    assert info.committed_tokens == committed and not info.busy
    ok = u.generate_ok(c, {"token_ids": {"ids": [11, 12]},
                           "session": {"session_id": sid},
                           "stopping": {"max_tokens": 4}})
    assert ok.ids
    c.call("specserve.v1.Sessions/CloseSession", session_id=sid)


@pytest.mark.parametrize("k", [0, 3])
def test_generation_reaching_capacity_finishes_context_full(cluster, k):
    c = cluster.client
    capacity = 48
    sid = c.call("specserve.v1.Sessions/OpenSession",
                 capacity=capacity).session_id
    prompt = u.prompt_ids(45, 10)
    r = u.generate_ok(c, {"token_ids": {"ids": prompt},
                          "session": {"session_id": sid},
                          "stopping": {"max_tokens": 0, "ignore_eos": True},
                          "speculation": {"enable": k > 0, "k": k}})
    assert u.finish_name(r) == "CONTEXT_FULL", r
    info = c.call("specserve.v1.Sessions/GetSession", session_id=sid)
    # Never a row past capacity; the scheduler and the worker agree.
    assert info.committed_tokens <= capacity
    assert info.committed_tokens == len(prompt) + len(r.ids)
    assert len(r.ids) >= capacity - len(prompt) - k - 2
    state = cluster.worker_client(0).call(
        "specserve.worker.v1.Worker/GetSessionState", session_id=sid,
        owner=u.WORKER_OWNER)
    assert state.committed_len == info.committed_tokens <= state.capacity
    assert list(r.ids) == u.specgen(prompt, len(r.ids), ignore_eos=True)
    # The full session refuses a turn that cannot fit.
    more = u.generate(c, {"token_ids": {"ids": [5] * (capacity + 1 -
                                                       len(prompt) -
                                                       len(r.ids))},
                          "session": {"session_id": sid},
                          "stopping": {"max_tokens": 1}})
    assert more.code == grpc.StatusCode.OUT_OF_RANGE, more
    c.call("specserve.v1.Sessions/CloseSession", session_id=sid)


# ---------------------------------------------------------------------------
# Row 7: bad ids and parameters

BASE = {"token_ids": {"ids": P1}, "stopping": {"max_tokens": 4}}
UNKNOWN_SESSION = "ses_" + "0" * 32
BAD = [
    ("id_at_vocab", {"token_ids": {"ids": [5, VOCAB]}},
     grpc.StatusCode.INVALID_ARGUMENT, "token_ids[1] = %d" % VOCAB),
    ("id_max_uint32", {"token_ids": {"ids": [2**32 - 1]}},
     grpc.StatusCode.INVALID_ARGUMENT, "outside the vocabulary"),
    ("stop_id_at_vocab", {"stopping": {"max_tokens": 4,
                                       "stop_token_ids": [VOCAB]}},
     grpc.StatusCode.INVALID_ARGUMENT, "stop_token_ids"),
    ("temperature_nan", {"sampling": {"temperature": "NaN"}},
     grpc.StatusCode.INVALID_ARGUMENT, "temperature"),
    ("temperature_inf", {"sampling": {"temperature": "Infinity"}},
     grpc.StatusCode.INVALID_ARGUMENT, "temperature"),
    ("temperature_neg_inf", {"sampling": {"temperature": "-Infinity"}},
     grpc.StatusCode.INVALID_ARGUMENT, "temperature"),
    ("temperature_negative", {"sampling": {"temperature": -0.5}},
     grpc.StatusCode.INVALID_ARGUMENT, "temperature"),
    ("top_p_above_1", {"sampling": {"temperature": 1, "top_p": 1.5}},
     grpc.StatusCode.INVALID_ARGUMENT, "top_p"),
    ("top_p_negative", {"sampling": {"temperature": 1, "top_p": -0.1}},
     grpc.StatusCode.INVALID_ARGUMENT, "top_p"),
    ("top_p_nan", {"sampling": {"temperature": 1, "top_p": "NaN"}},
     grpc.StatusCode.INVALID_ARGUMENT, "top_p"),
    ("min_p_1", {"sampling": {"temperature": 1, "min_p": 1.0}},
     grpc.StatusCode.INVALID_ARGUMENT, "min_p"),
    ("top_k_over_vocab", {"sampling": {"temperature": 1, "top_k": VOCAB + 1}},
     grpc.StatusCode.INVALID_ARGUMENT, "top_k"),
    ("huge_max_tokens", {"stopping": {"max_tokens": 2**32 - 1}},
     grpc.StatusCode.INVALID_ARGUMENT, "max_tokens"),
    ("k_9", {"speculation": {"enable": True, "k": 9}},
     grpc.StatusCode.INVALID_ARGUMENT, "speculation.k"),
    ("empty_input", {"token_ids": {"ids": []}},
     grpc.StatusCode.INVALID_ARGUMENT, "empty"),
    ("empty_stop_string", {"stopping": {"max_tokens": 4, "stop": [""]}},
     grpc.StatusCode.INVALID_ARGUMENT, "stop[0]"),
    ("rewind_without_session", {"session": {"mode": "REWIND"}},
     grpc.StatusCode.INVALID_ARGUMENT, "REWIND"),
    ("capacity_over_context", {"session": {"capacity": CONTEXT + 1}},
     grpc.StatusCode.INVALID_ARGUMENT, "capacity"),
    ("long_request_id", {"request_id": "r" * 200},
     grpc.StatusCode.INVALID_ARGUMENT, "request_id"),
    ("unknown_session", {"session": {"session_id": UNKNOWN_SESSION}},
     grpc.StatusCode.NOT_FOUND, UNKNOWN_SESSION),
]


def _raw_generate(client, payload, timeout=10):
    """Sends raw bytes as a GenerateRequest (what no well-behaved client
    library would encode)."""
    m = client.method(u.GENERATE)
    stub = client.channel.unary_stream(
        "/" + u.GENERATE, request_serializer=lambda b: b,
        response_deserializer=client.message_class(m.output_type).FromString)
    try:
        list(stub(payload, timeout=timeout))
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details()


def test_bad_requests_get_clear_statuses_and_never_reach_a_worker(cluster):
    c = cluster.client
    worker = cluster.worker_client(0)
    # A valid request runs alongside and must not notice anything.
    v = u.Stream(c, {"token_ids": {"ids": P2},
                     "stopping": {"max_tokens": 1500, "ignore_eos": True},
                     "speculation": {"enable": True, "k": 3}})
    v.wait_tokens(1)
    before = worker.call(u.WORKER_INFO)
    assert before.sessions == 1 and before.active_bursts == 1
    sessions_before = len(c.call("specserve.v1.Sessions/ListSessions")
                          .sessions)
    failures = []
    for name, patch, code, text in BAD:
        req = dict(BASE)
        req.update(patch)
        t0 = time.monotonic()
        r = u.generate(c, req, timeout=10)
        if r.code != code or text not in r.details:
            failures.append((name, r.code, r.details))
        assert time.monotonic() - t0 < 5, name
        # Nothing reached the worker: the only session there is v's.
        info = worker.call(u.WORKER_INFO)
        if info.sessions != 1:
            failures.append((name, "worker sessions", info.sessions))
    assert not failures, failures
    # Negative ids cannot be written in the API's JSON (uint32) ...
    with pytest.raises(json_format.ParseError):
        u.make_request(c, {"token_ids": {"ids": [-1]}})
    # ... and a negative varint sent anyway reads as 2^32 - 1: refused.
    minus_one = b"\xff" * 9 + b"\x01"
    inner = b"\x0a" + bytes([len(minus_one)]) + minus_one
    code, details = _raw_generate(c, b"\x12" + bytes([len(inner)]) + inner)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert "4294967295" in details
    # Garbage bytes are refused too (no crash).
    code, _ = _raw_generate(c, b"\x12\xff\xff\xff\xff\x0f")
    assert code != grpc.StatusCode.OK
    assert len(c.call("specserve.v1.Sessions/ListSessions").sessions) == \
        sessions_before
    r = v.join()
    assert r.ok and len(r.ids) >= 1500, r
    assert r.ids[:64] == u.specgen(P2, 64, ignore_eos=True)
    assert c.health("") == "SERVING"


# ---------------------------------------------------------------------------
# The draft depth limit (kMaxDraftDepth, proto/api_limits.h): one bound for
# the scheduler's check, the workers' sessions and the workers' own checks.

DRAFT_DEPTH_LIMIT = 8
W_ADMIT = "specserve.worker.v1.Worker/Admit"
W_BURST = "specserve.worker.v1.Worker/Burst"
W_STATE = "specserve.worker.v1.Worker/GetSessionState"
W_RELEASE = "specserve.worker.v1.Worker/Release"


def test_draft_depth_limit_runs_and_one_past_it_is_invalid(cluster):
    c = cluster.client
    limit = DRAFT_DEPTH_LIMIT
    over = "speculation.k %d is over the limit %d" % (limit + 1, limit)
    sid = c.call("specserve.v1.Sessions/OpenSession",
                 capacity=256).session_id

    def turn(ids, k):
        return u.generate(c, {"token_ids": {"ids": ids},
                              "session": {"session_id": sid},
                              "stopping": {"max_tokens": 12,
                                           "ignore_eos": True},
                              "speculation": {"enable": True, "k": k},
                              "response": {"spec_stats": True}})

    # k = the limit: rounds draft that deep, and the output is exact.
    prompt = u.prompt_ids(46, 10)
    first = turn(prompt, limit)
    assert first.ok, first
    stats = first.final.spec_stats
    assert stats.rounds > 0
    assert list(stats.drafted_per_position) == [stats.rounds] * limit
    u.assert_matches_reference(prompt, first, 12, ignore_eos=True)
    history = prompt + list(first.ids)
    # One past it: refused naming the value and the limit, on a session
    # turn and on a one-shot request alike.
    r = turn([11, 12], limit + 1)
    assert r.code == grpc.StatusCode.INVALID_ARGUMENT, r
    assert over in r.details, r.details
    r = u.generate(c, {"token_ids": {"ids": prompt},
                       "stopping": {"max_tokens": 4},
                       "speculation": {"enable": True, "k": limit + 1}})
    assert r.code == grpc.StatusCode.INVALID_ARGUMENT, r
    assert over in r.details, r.details
    # The session is untouched and goes on at the limit.
    info = c.call("specserve.v1.Sessions/GetSession", session_id=sid)
    assert info.committed_tokens == len(history) and not info.busy
    again = turn([11, 12], limit)
    assert again.ok, again
    assert list(again.final.spec_stats.drafted_per_position) == \
        [again.final.spec_stats.rounds] * limit
    u.assert_matches_reference(history + [11, 12], again, 12,
                               ignore_eos=True)
    c.call("specserve.v1.Sessions/CloseSession", session_id=sid)


def test_worker_refuses_draft_depth_over_the_limit(cluster):
    """The worker's own checks, for a caller that is not this scheduler:
    a session or a burst deeper than the limit is refused naming it, never
    run at a clamped depth."""
    worker = cluster.worker_client(0)
    limit = DRAFT_DEPTH_LIMIT
    sid = "ses_direct_draft_depth_limit"
    code, details = u.rpc_code(worker.call, W_ADMIT, session_id=sid,
                               capacity=256, speculative=True,
                               draft_depth=limit + 1)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert "draft_depth %d is over the limit %d" % (limit + 1, limit) in \
        details, details
    worker.call(W_ADMIT, session_id=sid, capacity=256, speculative=True,
                draft_depth=limit)
    prompt = u.prompt_ids(47, 10)
    for k in (limit + 1, 15, 2**32 - 1):
        code, details = u.rpc_code(worker.call, W_BURST, session_id=sid,
                                   suffix=prompt, max_new=8, k=k, timeout=60)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (k, code, details)
        assert "k %d is over the limit %d" % (k, limit) in details, details
    # Nothing ran: the session holds no rows, and a burst at the limit runs.
    assert worker.call(W_STATE, session_id=sid).committed_len == 0
    events = worker.call(W_BURST, session_id=sid, suffix=prompt, max_new=8,
                         k=limit, timeout=60)
    got = [t for e in events if e.HasField("tokens") for t in e.tokens.ids]
    assert len(got) >= 8
    assert got == u.specgen(prompt, len(got), ignore_eos=True)
    summary = [e.summary for e in events if e.HasField("summary")][0]
    assert summary.telemetry_delta.rounds > 0
    assert list(summary.telemetry_delta.drafted_per_position) == \
        [summary.telemetry_delta.rounds] * limit
    worker.call(W_RELEASE, session_id=sid)


def test_oversized_text_is_invalid_not_retryable(cluster):
    """A text over the API's size limit (8 MiB) is INVALID_ARGUMENT naming
    the limit, not a transport-level RESOURCE_EXHAUSTED a client would
    retry."""
    c = cluster.client
    text = "a" * (8 * 1024 * 1024 + 1)
    r = u.generate(c, {"text": text, "stopping": {"max_tokens": 1}})
    assert r.code == grpc.StatusCode.INVALID_ARGUMENT, r
    assert "8388608" in r.details, r.details
    code, details = u.rpc_code(c.call, "specserve.v1.Tokenization/Tokenize",
                               text=text)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details


def test_unknown_session_rpcs_are_not_found(cluster):
    c = cluster.client
    for rpc in ("GetSession", "CloseSession"):
        code, details = u.rpc_code(c.call, "specserve.v1.Sessions/" + rpc,
                                   session_id=UNKNOWN_SESSION)
        assert code == grpc.StatusCode.NOT_FOUND and UNKNOWN_SESSION in \
            details


def test_unparseable_requests_and_duplicate_ids_get_clear_codes(cluster):
    """A request that is not a protobuf message of its type, or holds a
    string that is not UTF-8, is INVALID_ARGUMENT naming the message type or
    the field, on Generate, Sessions and Tokenization alike; the same path
    serves well-formed requests. A request_id already running, like a second
    turn on a busy session, is ABORTED naming it; the id is free again once
    that request ended. (On `small`: the scheduler with metrics, whose
    running count says when the first request ended.)"""
    c, proc = cluster.small, cluster.small_proc
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
    ok = c.request(u.GENERATE)
    ok.text = "a"
    ok.stopping.max_tokens = 2
    assert _raw_generate(c, ok.SerializeToString())[0] == grpc.StatusCode.OK
    for method, body, fragment in [
            ("specserve.v1.Tokenization/Tokenize", bad_text,
             "text is not valid UTF-8"),
            ("specserve.v1.Sessions/GetSession", b"\x0a\x02\xc3\x28",
             "session_id is not valid"),
            ("specserve.v1.Sessions/OpenSession", b"\xff\xff",
             "is not a protobuf message")]:
        call = c.channel.unary_unary("/" + method,
                                     request_serializer=lambda b: b,
                                     response_deserializer=lambda b: b)
        code, details = u.rpc_code(call, body, timeout=u.RPC_TIMEOUT)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (method, code)
        assert fragment in details, details

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
    u.wait_until(lambda: u.metric(proc, "vllm:num_requests_running") == 0,
                 timeout=10, what="the first dup-1 request ended")
    u.generate_ok(c, {"text": "x", "request_id": "dup-1",
                      "stopping": {"max_tokens": 2}})
