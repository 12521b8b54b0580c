"""docs/RELIABILITY.md rows 1 and 2: a worker killed (SIGKILL) or hung (SIGSTOP)
mid-stream. The affected stream ends UNAVAILABLE within 2 s, the scheduler
stays up, new work goes to the other worker, the session (marked LOST) is
rebuilt from its token history on its next turn and continues exactly as a
never-interrupted session would (greedy), and the worker rejoins once
restarted (or continued)."""
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
