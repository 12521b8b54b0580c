"""docs/RELIABILITY.md rows 3 and 4: a client cancels at every phase (queued,
prefill, speculative verify rounds, plain decode) or its deadline passes. The
work stops, the worker's memory and session count return to the idle
baseline, and the session stays consistent and usable: its next turn is
exact (greedy, against specgen over the history the session reports).

One worker; the scheduler runs one request at a time (--max_running=1), so a
long request holding the slot queues the next one."""
import grpc
import pytest

import e2e_util as u

P1 = u.prompt_ids(31, 7)
P2 = u.prompt_ids(32, 5)
LONG = {"max_tokens": 3000, "ignore_eos": True}


@pytest.fixture(scope="module")
def cluster():
    c = u.Cluster(n_workers=1, worker_extra=[u.SPEC_ALWAYS_PAYS],
                  scheduler_extra=["--max_running=1", "--max_queued=4"],
                  metrics=True)
    yield c
    c.stop()


@pytest.fixture(autouse=True)
def idle_worker(cluster):
    """Each test starts (and must end) with no session on the worker."""
    yield u.wait_worker_idle(cluster, 0, sessions=0)
    for s in cluster.client.call("specserve.v1.Sessions/ListSessions") \
            .sessions:
        # (A one-shot request's own session may close itself meanwhile.)
        code, _ = u.rpc_code(cluster.client.call,
                             "specserve.v1.Sessions/CloseSession",
                             session_id=s.session_id)
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND)
    idle = u.wait_worker_idle(cluster, 0, sessions=0)
    assert idle.memory_used_bytes == 0


def _open(c, capacity=4096):
    return c.call("specserve.v1.Sessions/OpenSession",
                  capacity=capacity).session_id


def _get(c, sid):
    return c.call("specserve.v1.Sessions/GetSession", session_id=sid)


def _turn_req(sid, ids, stopping=None, k=3, **extra):
    req = {"token_ids": {"ids": ids}, "session": {"session_id": sid},
           "stopping": stopping or {"max_tokens": 8, "ignore_eos": True},
           "speculation": {"enable": k > 0, "k": k},
           "response": {"ids": True}}
    req.update(extra)
    return req


def _history(c, sid, prompt):
    """The session's history, rebuilt from its committed length: `prompt`
    followed by its greedy continuation (what every turn here produced)."""
    n = _get(c, sid).committed_tokens - len(prompt)
    assert n >= 0
    return prompt + u.specgen(prompt, n, ignore_eos=True)


def _settled(cluster, sid):
    """After an interrupted turn: the session is idle, either PARKED (the
    worker stopped the burst at a round boundary, or the cancellation fell
    between bursts: the worker copy is whole) or LOST (the copy was
    dropped: the deadline passed, or the worker did not stop the burst
    within the stop grace); the worker holds exactly that and runs nothing.
    Returns the session's info."""
    c = cluster.client
    info = u.wait_until(lambda: (lambda i: not i.busy and i)(_get(c, sid)),
                        what="session idle")
    residency = u.enum_name(info, "residency")
    assert residency in ("PARKED", "LOST"), info
    u.wait_worker_idle(cluster, 0, sessions=1 if residency == "PARKED" else 0)
    _consistent(cluster, sid)
    return info


def _consistent(cluster, sid):
    """A parked session: the worker's copy holds exactly the committed
    tokens the scheduler's history has (cache rows == committed)."""
    info = _get(cluster.client, sid)
    if u.enum_name(info, "residency") == "PARKED":
        state = cluster.worker_client(0).call(
            "specserve.worker.v1.Worker/GetSessionState", session_id=sid,
            owner=u.WORKER_OWNER)
        assert state.committed_len == info.committed_tokens
        assert not state.HasField("pending_tok")  # parked = flushed


def _next_turn_is_exact(cluster, sid, history):
    c = cluster.client
    r = u.generate_ok(c, _turn_req(sid, P2))
    u.assert_matches_reference(history + P2, r, 8, ignore_eos=True,
                               what="turn after the interruption")
    info = _get(c, sid)
    assert u.enum_name(info, "residency") == "PARKED"
    assert info.committed_tokens == len(history) + len(P2) + len(r.ids)
    assert info.rewind_pos == len(history) + len(P2)
    u.wait_worker_idle(cluster, 0, sessions=1)
    _consistent(cluster, sid)


def _cancelled(r):
    return r.code == grpc.StatusCode.CANCELLED


def test_cancel_while_queued(cluster):
    c = cluster.client
    sid = _open(c)
    first = u.generate_ok(c, _turn_req(sid, P1))
    history = P1 + list(first.ids)
    parked = u.wait_worker_idle(cluster, 0, sessions=1)
    holder = u.Stream(c, {"token_ids": {"ids": P1}, "stopping": LONG})
    holder.wait_tokens(1)
    queued = u.Stream(c, _turn_req(sid, P2))
    u.wait_until(lambda: u.metric(cluster.scheduler,
                                  "vllm:num_requests_waiting") == 1,
                 what="the turn queued behind the holder")
    queued.cancel()
    r = queued.join()
    assert _cancelled(r) and not r.ids, r
    u.wait_until(lambda: u.metric(cluster.scheduler,
                                  "vllm:num_requests_waiting") == 0,
                 what="queue empty")
    info = _get(c, sid)
    assert not info.busy and info.committed_tokens == len(history)
    assert u.enum_name(info, "residency") == "PARKED"
    holder.cancel()
    assert _cancelled(holder.join())
    idle = u.wait_worker_idle(cluster, 0, sessions=1)
    assert idle.memory_used_bytes == parked.memory_used_bytes
    _next_turn_is_exact(cluster, sid, history)


def test_cancel_during_prefill(cluster):
    c = cluster.client
    sid = _open(c)
    first = u.generate_ok(c, _turn_req(sid, P1))
    history = P1 + list(first.ids)
    parked = u.wait_worker_idle(cluster, 0, sessions=1)
    long_prompt = u.prompt_ids(33, 1500)
    st = u.Stream(c, _turn_req(sid, long_prompt))
    # The worker is busy with the burst and nothing was produced yet: the
    # 1500-token prefill is running.
    u.wait_until(lambda: cluster.worker_info(0).active_bursts == 1,
                 what="burst started")
    assert not st.result.ids and st.result.ended_at is None
    st.cancel()
    r = st.join()
    assert _cancelled(r) and not r.ids, r
    # The worker is asked to stop: it finishes the prefill pass and stops at
    # its first token, so the turn is kept (the prompt and that token, which
    # the gone client never got) and the session parked. A prefill that
    # outlasts the stop grace has its copy dropped instead: LOST, the turn
    # not recorded, rebuilt from the history next turn.
    info = _settled(cluster, sid)
    if u.enum_name(info, "residency") == "PARKED":
        turn = history + long_prompt
        assert info.committed_tokens == len(turn) + 1
        assert info.rewind_pos == len(turn)
        history = turn + u.specgen(turn, 1, ignore_eos=True)
    else:
        assert info.committed_tokens == len(history), "the cancelled " \
            "turn must not be recorded"
    _next_turn_is_exact(cluster, sid, history)
    # Nothing of the interrupted burst stays behind: the worker holds exactly
    # the session. A kept long prompt also kept the prefix checkpoint saved
    # inside it, so the session may have grown by those bytes, and only then.
    state = cluster.worker_client(0).call(
        "specserve.worker.v1.Worker/GetSessionState", session_id=sid,
        owner=u.WORKER_OWNER)
    used = cluster.worker_info(0).memory_used_bytes
    assert used == state.bytes
    if not state.prefix_checkpoints:
        assert used == parked.memory_used_bytes


@pytest.mark.parametrize("k", [3, 0], ids=["verify", "decode"])
def test_cancel_while_generating(cluster, k):
    c = cluster.client
    sid = _open(c)
    st = u.Stream(c, _turn_req(sid, P1, stopping=LONG, k=k))
    st.wait_tokens(20)
    st.cancel()
    r = st.join()
    assert _cancelled(r) and 20 <= len(r.ids) < 3000, r
    info = _settled(cluster, sid)
    assert info.rewind_pos == len(P1)
    # Everything the client was sent is in the history (and possibly a few
    # tokens the worker produced while the cancellation travelled).
    assert info.committed_tokens >= len(P1) + len(r.ids)
    history = _history(c, sid, P1)
    assert history[len(P1):len(P1) + len(r.ids)] == list(r.ids)
    _next_turn_is_exact(cluster, sid, history)


def test_rewind_after_cancelled_turn(cluster):
    """A REWIND turn on a session whose copy was dropped (LOST) rebuilds it
    at the checkpoint, and the history loses the discarded reply."""
    c = cluster.client
    sid = _open(c)
    first = u.generate_ok(c, _turn_req(sid, P1))
    history = P1 + list(first.ids)
    st = u.Stream(c, _turn_req(sid, P2, stopping=LONG))
    st.wait_tokens(10)
    st.cancel()
    assert _cancelled(st.join())
    _settled(cluster, sid)
    checkpoint = len(history) + len(P2)
    assert _get(c, sid).rewind_pos == checkpoint
    regen = u.generate_ok(c, {"session": {"session_id": sid,
                                          "mode": "REWIND"},
                              "stopping": {"max_tokens": 8,
                                           "ignore_eos": True},
                              "speculation": {"enable": True, "k": 3},
                              "response": {"ids": True}})
    u.assert_matches_reference(history + P2, regen, 8, ignore_eos=True)
    info = _get(c, sid)
    assert info.committed_tokens == checkpoint + len(regen.ids)
    assert info.rewind_pos == checkpoint
    # And the history is right: the next turn continues it exactly.
    _next_turn_is_exact(cluster, sid, history + P2 + list(regen.ids))


def test_deadline_during_generation(cluster):
    c = cluster.client
    rejected = u.metric(cluster.scheduler, "specserve_requests_rejected_total")
    r = u.generate(c, {"token_ids": {"ids": P1}, "stopping": LONG},
                   timeout=0.5)
    assert r.code == grpc.StatusCode.DEADLINE_EXCEEDED, r
    assert 0 < len(r.ids) < 3000
    # The scheduler saw it too (not only the client), and the worker stopped.
    u.wait_until(lambda: u.metric(cluster.scheduler,
                                  "specserve_requests_rejected_total")
                 > rejected, what="scheduler counts the failed request")
    u.wait_worker_idle(cluster, 0, sessions=0, timeout=3)


def test_deadline_in_a_session_keeps_it_usable(cluster):
    c = cluster.client
    sid = _open(c)
    r = u.generate(c, _turn_req(sid, P1, stopping=LONG), timeout=0.5)
    assert r.code == grpc.StatusCode.DEADLINE_EXCEEDED, r
    _settled(cluster, sid)
    history = _history(c, sid, P1)
    assert history[len(P1):len(P1) + len(r.ids)] == list(r.ids)
    _next_turn_is_exact(cluster, sid, history)


def test_deadline_while_queued(cluster):
    c = cluster.client
    holder = u.Stream(c, {"token_ids": {"ids": P1}, "stopping": LONG})
    holder.wait_tokens(1)
    r = u.generate(c, {"token_ids": {"ids": P2},
                       "stopping": {"max_tokens": 4}}, timeout=0.3)
    assert r.code == grpc.StatusCode.DEADLINE_EXCEEDED and not r.ids, r
    u.wait_until(lambda: u.metric(cluster.scheduler,
                                  "vllm:num_requests_waiting") == 0,
                 what="queue empty")
    holder.cancel()
    assert _cancelled(holder.join())


def test_abort_while_queued(cluster):
    """Admin.Abort (by request id, by session id) ends a queued request at
    once, without waiting for a slot."""
    c = cluster.client
    sid = _open(c)
    first = u.generate_ok(c, _turn_req(sid, P1))
    history = P1 + list(first.ids)
    holder = u.Stream(c, {"token_ids": {"ids": P1}, "stopping": LONG})
    holder.wait_tokens(1)
    by_id = u.Stream(c, {"token_ids": {"ids": P2}, "request_id": "queued-1",
                         "stopping": {"max_tokens": 4}})
    by_session = u.Stream(c, _turn_req(sid, P2))
    u.wait_until(lambda: u.metric(cluster.scheduler,
                                  "vllm:num_requests_waiting") == 2,
                 what="two requests queued")
    assert c.call("specserve.v1.Admin/Abort",
                  request_id="queued-1").aborted == 1
    assert c.call("specserve.v1.Admin/Abort", session_id=sid).aborted == 1
    for st in (by_id, by_session):
        r = st.join(10)
        assert (r.code == grpc.StatusCode.CANCELLED or
                (r.ok and u.finish_name(r) == "CANCELLED")) and not r.ids, r
    assert holder.result.ended_at is None, "aborts waited for the slot"
    holder.cancel()
    assert _cancelled(holder.join())
    info = _get(c, sid)
    assert info.committed_tokens == len(history) and not info.busy
    _next_turn_is_exact(cluster, sid, history)
