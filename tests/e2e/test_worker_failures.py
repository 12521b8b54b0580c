"""docs/RELIABILITY.md rows 1 and 2: a worker killed (SIGKILL) or hung (SIGSTOP)
mid-stream. The affected stream ends UNAVAILABLE within 2 s, the scheduler
stays up, new work goes to the other worker, the session (marked LOST) is
rebuilt from its token history on its next turn and continues exactly as a
never-interrupted session would (greedy), and the worker rejoins once
restarted (or continued). A rebuilt copy keeps the table's rewind point (the
last prompt's end, also after an empty continuation), and the turn that
rebuilt it reports no cached prompt tokens."""
import signal
import time

import grpc
import pytest

import e2e_util as u

PROMPT = u.prompt_ids(21, 9)


@pytest.fixture(scope="module")
def cluster():
    c = u.Cluster(n_workers=2, worker_extra=[u.SPEC_ALWAYS_PAYS])
    yield c
    for w in c.workers:
        w.signal(signal.SIGCONT)
    c.stop()


@pytest.fixture(autouse=True)
def all_workers_up(cluster):
    """Each test starts with both workers alive and available (an earlier
    failure may have left one dead or stopped)."""
    for i, w in enumerate(cluster.workers):
        w.signal(signal.SIGCONT)
        if w.popen.poll() is not None:
            cluster.restart_worker(i)
    u.wait_until(lambda: all(w.available for w in _info(cluster.client)
                             .workers), timeout=15, what="workers available")
    yield


def _info(c):
    return c.call("specserve.v1.Admin/GetServerInfo")


def _available(cluster, i):
    return _info(cluster.client).workers[i].available


def _session(c, sid):
    return c.call("specserve.v1.Sessions/GetSession", session_id=sid)


def _long_turn(c, sid, prompt=PROMPT, k=3):
    return u.Stream(c, {"token_ids": {"ids": prompt},
                        "session": {"session_id": sid},
                        "stopping": {"max_tokens": 3000, "ignore_eos": True},
                        "speculation": {"enable": k > 0, "k": k},
                        "response": {"ids": True}})


def _continue(c, sid, n=12):
    return u.generate_ok(c, {"session": {"session_id": sid},
                             "stopping": {"max_tokens": n, "ignore_eos": True},
                             "speculation": {"enable": True, "k": 2},
                             "response": {"ids": True}})


def _check_interrupted_then_rebuilt(cluster, sid, r, dead):
    """The stream r of session sid ended when worker `dead` failed."""
    c = cluster.client
    other = cluster.workers[1 - dead].address
    assert c.health("") == "SERVING"
    info = _session(c, sid)
    assert u.enum_name(info, "residency") == "LOST", info
    # The session kept exactly what the client was sent.
    assert info.committed_tokens == len(PROMPT) + len(r.ids)
    # New work goes to the surviving worker.
    u.wait_until(lambda: not _available(cluster, dead), timeout=5,
                 what="scheduler marks the worker unavailable")
    sid2 = c.call("specserve.v1.Sessions/OpenSession").session_id
    fresh = u.generate_ok(c, {"token_ids": {"ids": PROMPT},
                              "session": {"session_id": sid2},
                              "stopping": {"max_tokens": 8}})
    u.assert_matches_reference(PROMPT, fresh, 8)
    assert _session(c, sid2).worker == other
    # The lost session is rebuilt there from its history and continues as if
    # never interrupted.
    nxt = _continue(c, sid)
    whole = list(r.ids) + list(nxt.ids)
    ref = u.specgen(PROMPT, len(whole), ignore_eos=True)
    assert whole == ref, "continuation after the rebuild is not exact"
    info = _session(c, sid)
    assert u.enum_name(info, "residency") == "PARKED" and info.worker == other
    for s in (sid, sid2):
        c.call("specserve.v1.Sessions/CloseSession", session_id=s)


def _restart_and_rejoin(cluster, i):
    cluster.restart_worker(i)
    u.wait_until(lambda: _available(cluster, i), timeout=15,
                 what="restarted worker rejoins")


def test_sigkill_mid_stream(cluster):
    c = cluster.client
    sid = c.call("specserve.v1.Sessions/OpenSession",
                 capacity=4096).session_id
    st = _long_turn(c, sid)
    st.wait_tokens(8)
    dead = u.worker_index_by_address(cluster, _session(c, sid).worker)
    killed_at = time.monotonic()
    cluster.workers[dead].signal(signal.SIGKILL)
    r = st.join(10)
    assert r.code == grpc.StatusCode.UNAVAILABLE, r
    assert r.ended_at - killed_at < 2.0
    assert 8 <= len(r.ids) < 3000
    _check_interrupted_then_rebuilt(cluster, sid, r, dead)
    _restart_and_rejoin(cluster, dead)
    # The rejoined worker takes new sessions again (it is the least loaded).
    sid3 = c.call("specserve.v1.Sessions/OpenSession").session_id
    r3 = u.generate_ok(c, {"token_ids": {"ids": PROMPT},
                           "session": {"session_id": sid3},
                           "stopping": {"max_tokens": 8}})
    u.assert_matches_reference(PROMPT, r3, 8)
    assert _session(c, sid3).worker == cluster.workers[dead].address
    c.call("specserve.v1.Sessions/CloseSession", session_id=sid3)


def test_parked_session_survives_its_worker_dying(cluster):
    """A session parked on a worker that dies is rebuilt on the next turn,
    even when that turn comes before the scheduler's health poll noticed."""
    c = cluster.client
    sid = c.call("specserve.v1.Sessions/OpenSession").session_id
    first = u.generate_ok(c, {"token_ids": {"ids": PROMPT},
                              "session": {"session_id": sid},
                              "stopping": {"max_tokens": 10,
                                           "ignore_eos": True},
                              "response": {"ids": True}})
    dead = u.worker_index_by_address(cluster, _session(c, sid).worker)
    cluster.workers[dead].signal(signal.SIGKILL)
    cluster.workers[dead].wait(5)
    nxt = _continue(c, sid)
    whole = list(first.ids) + list(nxt.ids)
    assert whole == u.specgen(PROMPT, len(whole), ignore_eos=True)
    assert _session(c, sid).worker == cluster.workers[1 - dead].address
    # Restarted at once: a session the scheduler still thinks is parked on
    # the restarted worker is rebuilt too (the new process says NOT_FOUND).
    _restart_and_rejoin(cluster, dead)
    sid2 = c.call("specserve.v1.Sessions/OpenSession").session_id
    a = u.generate_ok(c, {"token_ids": {"ids": PROMPT},
                          "session": {"session_id": sid2},
                          "stopping": {"max_tokens": 6, "ignore_eos": True},
                          "response": {"ids": True}})
    on = u.worker_index_by_address(cluster, _session(c, sid2).worker)
    cluster.workers[on].signal(signal.SIGKILL)
    cluster.workers[on].wait(5)
    cluster.restart_worker(on)
    b = _continue(c, sid2)
    whole = list(a.ids) + list(b.ids)
    assert whole == u.specgen(PROMPT, len(whole), ignore_eos=True)
    u.wait_until(lambda: _available(cluster, on), timeout=15,
                 what="restarted worker rejoins")
    for s in (sid, sid2):
        c.call("specserve.v1.Sessions/CloseSession", session_id=s)


def test_sigstop_mid_stream(cluster):
    c = cluster.client
    sid = c.call("specserve.v1.Sessions/OpenSession",
                 capacity=4096).session_id
    st = _long_turn(c, sid, k=0)
    st.wait_tokens(8)
    hung = u.worker_index_by_address(cluster, _session(c, sid).worker)
    stopped_at = time.monotonic()
    cluster.workers[hung].signal(signal.SIGSTOP)
    try:
        r = st.join(10)
        assert r.code == grpc.StatusCode.UNAVAILABLE, r
        assert r.ended_at - stopped_at < 2.0
        assert 8 <= len(r.ids) < 3000
        _check_interrupted_then_rebuilt(cluster, sid, r, hung)
    finally:
        cluster.workers[hung].signal(signal.SIGCONT)
    u.wait_until(lambda: _available(cluster, hung), timeout=15,
                 what="continued worker rejoins")
    # The hung worker's copy of the session was abandoned mid-burst; it must
    # not stay there for good: every session closed, every worker is empty.
    for i in range(2):
        u.wait_worker_idle(cluster, i, sessions=0)


# ---------------------------------------------------------------------------
# What a rebuilt session keeps: its rewind point, and what its turn reports


def _tokens(c, text):
    return list(c.call("specserve.v1.Tokenization/Tokenize", text=text,
                       parse_special=True).ids)


def _turn(c, sid, text=None, ids=None, n=8, rewind=False):
    """A plain greedy turn of n tokens (APPEND, or REWIND)."""
    req = {"session": {"session_id": sid,
                       "mode": "REWIND" if rewind else "APPEND"},
           "stopping": {"max_tokens": n, "ignore_eos": True},
           "speculation": {"enable": False},
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
    session holds as many rows, and its checkpoint is at the same place.
    Returns that worker's index."""
    info = _session(cluster.client, sid)
    assert u.enum_name(info, "residency") == "PARKED", info
    i = u.worker_index_by_address(cluster, info.worker)
    state = cluster.worker_client(i).call(
        "specserve.worker.v1.Worker/GetSessionState", session_id=sid,
        owner=u.WORKER_OWNER)
    assert (info.committed_tokens, info.rewind_pos) == (committed, rewind_pos)
    assert (state.committed_len, state.rewind_pos) == (committed,
                                                       rewind_pos), state
    return i


def _kill(cluster, i):
    cluster.workers[i].signal(signal.SIGKILL)
    u.wait_until(lambda: not _available(cluster, i), timeout=10,
                 what="scheduler marks worker %d unavailable" % i)


def _fresh(c, ids, n=8):
    """What a new session with exactly this history produces."""
    sid = c.call("specserve.v1.Sessions/OpenSession").session_id
    out = _turn(c, sid, ids=ids, n=n).ids
    c.call("specserve.v1.Sessions/CloseSession", session_id=sid)
    return out


def test_rewind_point_survives_an_empty_continuation_and_a_rebuild(cluster):
    """A turn with no new input keeps the session's rewind point at the last
    prompt's end, in the scheduler's table and in the worker's copy alike, so
    a REWIND replaces both replies after that prompt. A copy rebuilt from the
    history after its worker died (by an empty continuation too) is
    checkpointed at the table's rewind point (AdmitRequest.checkpoint_pos),
    so a REWIND still goes back there, exactly."""
    c = cluster.client
    sid = c.call("specserve.v1.Sessions/OpenSession",
                 capacity=64).session_id
    p1 = _tokens(c, "def add(a, b):\n")
    s3 = _tokens(c, "    return a + b\n")
    out1 = _turn(c, sid, text="def add(a, b):\n").ids
    out2 = _turn(c, sid).ids  # empty continuation: the checkpoint stays
    _in_step(cluster, sid, len(p1) + 16, len(p1))
    r3 = _turn(c, sid, text="    return a + b\n", rewind=True)
    assert r3.final.usage.cached_prompt_tokens == len(p1)
    history = p1 + s3 + list(r3.ids)  # the replies REWIND dropped are gone
    holder = _in_step(cluster, sid, len(history), len(p1) + len(s3))
    assert list(r3.ids) == _fresh(c, p1 + s3)
    assert list(out1) + list(out2) == u.specgen(p1, 16, ignore_eos=True)

    # Rebuilt on the other worker by an empty continuation.
    _kill(cluster, holder)
    out4 = _turn(c, sid).ids
    assert list(out4) == u.specgen(history, 8, ignore_eos=True)
    history += list(out4)
    _in_step(cluster, sid, len(history), len(p1) + len(s3))
    s5 = _tokens(c, "    return a - b\n")
    r5 = _turn(c, sid, text="    return a - b\n", rewind=True)
    assert list(r5.ids) == _fresh(c, p1 + s3 + s5)
    _in_step(cluster, sid, len(p1 + s3 + s5) + 8, len(p1 + s3 + s5))
    c.call("specserve.v1.Sessions/CloseSession", session_id=sid)


def test_a_rebuilt_turn_reports_no_cached_prompt_tokens(cluster):
    """The turn that rebuilds a session on another worker (a prefill of its
    whole history) reports cached_prompt_tokens 0: nothing of its prompt came
    from a cache. It continues exactly, and the next turn serves the whole
    history from the caches again."""
    c = cluster.client
    sid = c.call("specserve.v1.Sessions/OpenSession").session_id
    p1, p2, p3 = u.prompt_ids(71, 12), u.prompt_ids(72, 5), u.prompt_ids(73, 4)
    r1 = _turn(c, sid, ids=p1)
    assert r1.final.usage.cached_prompt_tokens == 0
    _kill(cluster, u.worker_index_by_address(cluster, _session(c, sid).worker))
    r2 = _turn(c, sid, ids=p2)
    assert r2.final.usage.cached_prompt_tokens == 0, r2
    history = p1 + list(r1.ids) + p2
    assert list(r2.ids) == u.specgen(history, 8, ignore_eos=True)
    history += list(r2.ids)
    r3 = _turn(c, sid, ids=p3)
    assert r3.final.usage.cached_prompt_tokens == len(history), r3
    c.call("specserve.v1.Sessions/CloseSession", session_id=sid)
