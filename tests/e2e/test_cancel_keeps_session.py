"""docs/RELIABILITY.md row 3 (issue 27): a client cancel or an Admin.Abort in
the middle of a session turn stops the burst at a round boundary and keeps
the session resident. It ends PARKED (not LOST) on the same worker, the
scheduler's history equals the worker's committed tokens, and the next turn
reuses that history from the caches (no rebuild by prefill) and continues it
exactly (greedy, against specgen over the whole history).

After a client cancel the client is gone, so the history may hold a few
tokens it never got (the round in flight when the stop reached the worker):
GetSession's committed_tokens says how many. After an Admin.Abort the client
gets every one of them, then a final event with finish_reason CANCELLED.

The last test is about a one-shot request whose worker dies: it has no next
turn, so its error tells the client to retry it."""
import signal

import grpc
import pytest

import e2e_util as u

P1 = u.prompt_ids(271, 7)
P2 = u.prompt_ids(272, 5)
LONG = {"max_tokens": 3000, "ignore_eos": True}
NEXT = 8  # tokens of the turn after the interruption


@pytest.fixture(scope="module")
def cluster():
    c = u.Cluster(n_workers=1, worker_extra=[u.SPEC_ALWAYS_PAYS])
    yield c
    c.stop()


@pytest.fixture(autouse=True)
def no_sessions_left(cluster):
    yield
    for s in cluster.client.call("specserve.v1.Sessions/ListSessions") \
            .sessions:
        cluster.client.call("specserve.v1.Sessions/CloseSession",
                            session_id=s.session_id)
    u.wait_worker_idle(cluster, 0, sessions=0)


def _get(c, sid):
    return c.call("specserve.v1.Sessions/GetSession", session_id=sid)


def _turn(sid, ids, stopping, k, request_id=""):
    return {"token_ids": {"ids": ids}, "session": {"session_id": sid},
            "stopping": stopping, "speculation": {"enable": k > 0, "k": k},
            "response": {"ids": True}, "request_id": request_id}


def _parked_and_consistent(cluster, sid):
    """The interrupted session is idle and PARKED, and the worker's copy
    holds exactly the scheduler's committed tokens (flushed). Returns the
    session's info."""
    c = cluster.client
    info = u.wait_until(lambda: (lambda i: not i.busy and i)(_get(c, sid)),
                        what="session idle")
    assert u.enum_name(info, "residency") == "PARKED", info
    assert info.worker == cluster.workers[0].address
    u.wait_worker_idle(cluster, 0, sessions=1)
    state = cluster.worker_client(0).call(
        "specserve.worker.v1.Worker/GetSessionState", session_id=sid,
        owner=u.WORKER_OWNER)
    assert state.committed_len == info.committed_tokens, (state, info)
    assert not state.HasField("pending_tok")
    return info


def _history(info, prompt):
    """prompt + its greedy continuation up to the committed length (every
    interrupted turn here is greedy on a fresh session)."""
    n = info.committed_tokens - len(prompt)
    assert n >= 0, info
    return prompt + u.specgen(prompt, n, ignore_eos=True)


def _next_turn_reuses_history(cluster, sid, history, k):
    c = cluster.client
    r = u.generate_ok(c, _turn(sid, P2, {"max_tokens": NEXT,
                                         "ignore_eos": True}, k))
    # Served from the parked caches: the whole history counts as cached and
    # the session was not rebuilt.
    assert r.final.usage.cached_prompt_tokens == len(history), r
    assert ("session %s rebuilt" % sid) not in cluster.scheduler.text()
    u.assert_matches_reference(history + P2, r, NEXT, ignore_eos=True,
                               what="turn after the interruption")
    info = _parked_and_consistent(cluster, sid)
    assert info.committed_tokens == len(history) + len(P2) + len(r.ids)


@pytest.mark.parametrize("k", [3, 0], ids=["spec", "plain"])
def test_client_cancel_keeps_session(cluster, k):
    c = cluster.client
    sid = c.call("specserve.v1.Sessions/OpenSession",
                 capacity=4096).session_id
    st = u.Stream(c, _turn(sid, P1, LONG, k))
    st.wait_tokens(20)
    st.cancel()
    r = st.join()
    assert r.code == grpc.StatusCode.CANCELLED and 20 <= len(r.ids) < 3000, r
    info = _parked_and_consistent(cluster, sid)
    assert info.rewind_pos == len(P1)
    # Everything the client got, then what the worker committed while the
    # stop travelled.
    assert info.committed_tokens >= len(P1) + len(r.ids)
    history = _history(info, P1)
    assert history[len(P1):len(P1) + len(r.ids)] == list(r.ids)
    _next_turn_reuses_history(cluster, sid, history, k)


@pytest.mark.parametrize("k", [3, 0], ids=["spec", "plain"])
def test_abort_keeps_session(cluster, k):
    c = cluster.client
    sid = c.call("specserve.v1.Sessions/OpenSession",
                 capacity=4096).session_id
    rid = "abort-keeps-%d" % k
    st = u.Stream(c, _turn(sid, P1, LONG, k, request_id=rid))
    st.wait_tokens(20)
    assert c.call("specserve.v1.Admin/Abort", request_id=rid).aborted == 1
    r = st.join()
    assert r.ok and u.finish_name(r) == "CANCELLED", r
    assert 20 <= len(r.ids) < 3000, r
    assert r.final.request_id == rid and r.final.session_id == sid
    assert r.final.usage.completion_tokens == len(r.ids)
    assert r.final.usage.prompt_tokens == len(P1)
    info = _parked_and_consistent(cluster, sid)
    # The client was sent every token up to the stop: the history is
    # exactly the prompt and them.
    assert info.committed_tokens == len(P1) + len(r.ids)
    history = P1 + list(r.ids)
    assert history == _history(info, P1)
    _next_turn_reuses_history(cluster, sid, history, k)


def test_one_shot_worker_failure_says_retry():
    """A one-shot request has no next turn to rebuild on: the UNAVAILABLE
    it gets when its worker dies mid-stream tells it to retry."""
    cluster = u.Cluster(n_workers=1, worker_extra=[u.SPEC_ALWAYS_PAYS])
    try:
        st = u.Stream(cluster.client, {"token_ids": {"ids": P1},
                                       "stopping": LONG,
                                       "response": {"ids": True}})
        st.wait_tokens(8)
        cluster.workers[0].signal(signal.SIGKILL)
        r = st.join(10)
        assert r.code == grpc.StatusCode.UNAVAILABLE, r
        assert cluster.workers[0].address in r.details, r
        assert "retry" in r.details, r
        assert "next turn" not in r.details and "session" not in r.details, r
    finally:
        cluster.stop()
