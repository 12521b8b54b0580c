"""Sessions under memory pressure (docs/DESIGN.md §1 "pool", §2 residency): a
worker over its device budget offloads idle sessions to host memory (exact on
resume: the next turn still comes from the cache, and GetSession says
OFFLOADED), and one over its host budget drops the least recently used —
also between two bursts of one request — after which the scheduler rebuilds
the session from its history, still exactly.

Two workers, each with its own scheduler cutting requests into short bursts:
`offload` (no device budget) and `drop` (no device budget, and a host budget
of 1 MiB: two parked sessions' snapshots, not three)."""
import pytest

import e2e_util as u

P1 = u.prompt_ids(81, 7)
P2 = u.prompt_ids(82, 5)


@pytest.fixture(scope="module")
def cluster():
    c = u.Cluster(n_workers=2, worker_extra=[u.SPEC_ALWAYS_PAYS],
                  per_worker_extra=[
                      ["--memory_budget_mb=0", "--host_budget_mb=1024"],
                      ["--memory_budget_mb=0", "--host_budget_mb=1"]],
                  scheduler=False)
    try:
        c.offload_proc = c.add_scheduler([c.workers[0].address],
                                         ["--burst_tokens=8"])
        c.offload = c.client_for(c.offload_proc)
        c.drop_proc = c.add_scheduler([c.workers[1].address],
                                      ["--burst_tokens=8"])
        c.drop = c.client_for(c.drop_proc)
    except BaseException:
        c.stop()
        raise
    yield c
    c.stop()


def _turn(sid, ids, n, k):
    return {"token_ids": {"ids": ids}, "session": {"session_id": sid},
            "stopping": {"max_tokens": n, "ignore_eos": True},
            "speculation": {"enable": k > 0, "k": k},
            "response": {"ids": True}}


def _get(c, sid):
    return c.call("specserve.v1.Sessions/GetSession", session_id=sid)


def _close_all(c):
    for s in c.call("specserve.v1.Sessions/ListSessions").sessions:
        c.call("specserve.v1.Sessions/CloseSession", session_id=s.session_id)


@pytest.mark.parametrize("k", [0, 3])
def test_offloaded_sessions_resume_exactly(cluster, k):
    c = cluster.offload
    sid = c.call("specserve.v1.Sessions/OpenSession").session_id
    # 40 tokens in bursts of 8: offloaded and restored between bursts.
    r1 = u.generate_ok(c, _turn(sid, P1, 40, k))
    u.assert_matches_reference(P1, r1, 40, ignore_eos=True)
    info = _get(c, sid)
    assert u.enum_name(info, "residency") == "OFFLOADED", info
    w = cluster.worker_info(0)
    assert w.sessions == 1 and w.memory_used_bytes == 0
    history = P1 + list(r1.ids)
    r2 = u.generate_ok(c, _turn(sid, P2, 12, k))
    assert r2.final.usage.cached_prompt_tokens == len(history)
    u.assert_matches_reference(history + P2, r2, 12, ignore_eos=True)
    c.call("specserve.v1.Sessions/CloseSession", session_id=sid)
    u.wait_worker_idle(cluster, 0, sessions=0)


def test_dropped_session_is_rebuilt_on_its_next_turn(cluster):
    c = cluster.drop
    sids, histories = [], []
    for i in range(3):
        sid = c.call("specserve.v1.Sessions/OpenSession").session_id
        prompt = u.prompt_ids(90 + i, 6)
        r = u.generate_ok(c, _turn(sid, prompt, 10, 2))
        sids.append(sid)
        histories.append(prompt + list(r.ids))
    # Three parked sessions do not fit the host budget: the least recently
    # used went. Whichever did, every next turn continues exactly.
    assert cluster.worker_info(1).sessions < 3
    for sid, history in zip(sids, histories):
        r = u.generate_ok(c, _turn(sid, P2, 10, 2))
        u.assert_matches_reference(history + P2, r, 10, ignore_eos=True)
        assert _get(c, sid).committed_tokens == \
            len(history) + len(P2) + len(r.ids)
    _close_all(c)
    u.wait_worker_idle(cluster, 1, sessions=0)


@pytest.mark.parametrize("k", [0, 3])
def test_session_lost_between_bursts_is_rebuilt_mid_request(cluster, k):
    """The worker loses a session between two bursts of one request (as an
    eviction or a restart would; here the test releases it through the
    internal API while a burst runs). The next burst finds it gone, the
    scheduler rebuilds it from everything streamed so far, and the request
    goes on, exactly."""
    c = cluster.offload
    sid = c.call("specserve.v1.Sessions/OpenSession",
                 capacity=2048).session_id
    st = u.Stream(c, _turn(sid, P1, 400, k))
    st.wait_tokens(20)
    cluster.worker_client(0).call("specserve.worker.v1.Worker/Release",
                                  session_id=sid, owner=u.WORKER_OWNER)
    r = st.join()
    assert r.ok, r
    u.assert_matches_reference(P1, r, 400, ignore_eos=True)
    info = _get(c, sid)
    assert info.committed_tokens == len(P1) + len(r.ids)
    assert "session %s rebuilt on worker" % sid in \
        cluster.offload_proc.text(), "the session was not lost mid-request"
    # The next turn continues the history exactly.
    nxt = u.generate_ok(c, _turn(sid, P2, 6, k))
    u.assert_matches_reference(P1 + list(r.ids) + P2, nxt, 6,
                               ignore_eos=True)
    c.call("specserve.v1.Sessions/CloseSession", session_id=sid)
    u.wait_worker_idle(cluster, 0, sessions=0)
