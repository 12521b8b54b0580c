"""docs/RELIABILITY.md row 15: graceful drain, by SIGTERM or Admin.Drain.
Health turns NOT_SERVING, new work is refused UNAVAILABLE (naming the drain),
in-flight requests finish within the grace period (exactly, with all their
tokens). A request that cannot finish in the grace period is stopped at a
round boundary: it gets every token produced, then a final event CANCELLED
with its usage, and its session stays parked and consistent. After SIGTERM
the process then exits 0; after Admin.Drain it stays up (draining) until
SIGTERM, so an operator can inspect it first."""
import signal
import time

import grpc

import e2e_util as u

P1 = u.prompt_ids(61, 6)
P2 = u.prompt_ids(62, 7)
SERVICES = ["", "specserve.v1.Generation", "specserve.v1.Sessions",
            "specserve.v1.Tokenization", "specserve.v1.Admin"]


def _long(ids, n, k):
    return {"token_ids": {"ids": ids},
            "stopping": {"max_tokens": n, "ignore_eos": True},
            "speculation": {"enable": k > 0, "k": k},
            "response": {"ids": True}}


def test_sigterm_drains_in_flight_work():
    cluster = u.Cluster(n_workers=1, worker_extra=[u.SPEC_ALWAYS_PAYS],
                        scheduler_extra=["--drain_grace_seconds=30"])
    try:
        c = cluster.client
        sched = cluster.scheduler
        sid = c.call("specserve.v1.Sessions/OpenSession",
                     capacity=4096).session_id
        in_flight = [u.Stream(c, _long(P1, 1500, 0)),
                     u.Stream(c, dict(_long(P2, 1200, 3),
                                      session={"session_id": sid}))]
        for s in in_flight:
            s.wait_tokens(1)
        sched.signal(signal.SIGTERM)
        signalled = time.monotonic()
        u.wait_until(lambda: c.health("") == "NOT_SERVING", timeout=5,
                     what="health NOT_SERVING")
        for name in SERVICES:
            assert c.health(name) == "NOT_SERVING", name
        assert c.call("specserve.v1.Admin/GetServerInfo").draining
        # New work is refused while the old finishes.
        r = u.generate(c, {"token_ids": {"ids": P1},
                           "stopping": {"max_tokens": 4}})
        assert r.code == grpc.StatusCode.UNAVAILABLE and "draining" in \
            r.details, r
        code, _ = u.rpc_code(c.call, "specserve.v1.Sessions/OpenSession")
        assert code == grpc.StatusCode.UNAVAILABLE
        assert any(s.result.ended_at is None for s in in_flight), \
            "the in-flight requests ended before the drain was checked"
        a, b = [s.join(30) for s in in_flight]
        assert a.ok and u.finish_name(a) == "LENGTH" and len(a.ids) == 1500
        assert b.ok and u.finish_name(b) == "LENGTH" and len(b.ids) >= 1200
        assert a.ids[:64] == u.specgen(P1, 64, ignore_eos=True)
        assert b.ids[:64] == u.specgen(P2, 64, ignore_eos=True)
        assert b.final.session_id == sid
        assert sched.wait(30) == 0, sched.text()[-3000:]
        assert time.monotonic() - signalled < 30
        # The worker was left clean: the session was parked and the one-shot
        # freed; draining the worker too exits 0.
        assert u.wait_worker_idle(cluster, 0, sessions=1).active_bursts == 0
        cluster.workers[0].signal(signal.SIGTERM)
        assert cluster.workers[0].wait(30) == 0
    finally:
        cluster.stop()


def test_grace_period_cuts_off_work_that_does_not_finish():
    cluster = u.Cluster(n_workers=1, worker_extra=[u.SPEC_ALWAYS_PAYS],
                        scheduler_extra=["--drain_grace_seconds=1"])
    try:
        c = cluster.client
        sid = c.call("specserve.v1.Sessions/OpenSession",
                     capacity=4096).session_id
        st = u.Stream(c, _long(P1, 4000, 0))
        turn = u.Stream(c, dict(_long(P2, 4000, 3),
                                session={"session_id": sid}))
        for s in (st, turn):
            s.wait_tokens(1)
        cluster.scheduler.signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert cluster.scheduler.wait(15) == 0, \
            cluster.scheduler.text()[-3000:]
        r, b = st.join(15), turn.join(15)
        _cut_at_a_round_boundary(r, 4000)
        _cut_at_a_round_boundary(b, 4000)
        assert r.ended_at - signalled < 5
        # The worker stopped both bursts: the one-shot session was freed, the
        # other parked holding exactly what its client was sent.
        u.wait_worker_idle(cluster, 0, sessions=1)
        state = cluster.worker_client(0).call(
            "specserve.worker.v1.Worker/GetSessionState", session_id=sid,
            owner=u.WORKER_OWNER)
        assert state.committed_len == len(P2) + len(b.ids)
    finally:
        cluster.stop()


def _cut_at_a_round_boundary(r, max_tokens):
    """r was stopped by the end of the grace period: a final event, not a
    cancelled call."""
    assert r.ok and u.finish_name(r) == "CANCELLED", r
    assert 0 < len(r.ids) < max_tokens, r
    assert r.final.usage.completion_tokens == len(r.ids), r


def _session(c, sid):
    return c.call("specserve.v1.Sessions/GetSession", session_id=sid)


def _stays_up(proc, c):
    """The drain is over (where a drain that stops the process would have
    shut it down) and the process keeps running and answering."""
    u.wait_until(lambda: "drained: refusing new work until SIGTERM"
                 in proc.text(), what="drain over")
    assert proc.popen.poll() is None, proc.text()[-3000:]
    assert c.call("specserve.v1.Admin/GetServerInfo").draining
    assert c.health("") == "NOT_SERVING"


def test_admin_drain_stops_new_work_and_stays_up():
    cluster = u.Cluster(n_workers=1, worker_extra=[u.SPEC_ALWAYS_PAYS],
                        scheduler_extra=["--drain_grace_seconds=30"])
    try:
        c = cluster.client
        sched = cluster.scheduler
        sid = c.call("specserve.v1.Sessions/OpenSession",
                     capacity=4096).session_id
        st = u.Stream(c, dict(_long(P2, 1200, 3), session={"session_id": sid}))
        st.wait_tokens(1)
        assert c.call("specserve.v1.Admin/Drain").in_flight == 1
        u.wait_until(lambda: c.health("") == "NOT_SERVING", timeout=5,
                     what="health NOT_SERVING")
        for name in SERVICES:
            assert c.health(name) == "NOT_SERVING", name
        r = u.generate(c, {"token_ids": {"ids": P1},
                           "stopping": {"max_tokens": 4}})
        assert r.code == grpc.StatusCode.UNAVAILABLE and "draining" in \
            r.details, r
        assert st.result.ended_at is None, "ended before the drain was checked"
        b = st.join(30)
        assert b.ok and u.finish_name(b) == "LENGTH" and len(b.ids) >= 1200
        assert b.ids[:64] == u.specgen(P2, 64, ignore_eos=True)
        # Drained, not stopped: still refusing new work, still answering.
        _stays_up(sched, c)
        r = u.generate(c, {"token_ids": {"ids": P1},
                           "stopping": {"max_tokens": 4}})
        assert r.code == grpc.StatusCode.UNAVAILABLE and "draining" in \
            r.details, r
        info = _session(c, sid)
        assert u.enum_name(info, "residency") == "PARKED", info
        assert info.committed_tokens == len(P2) + len(b.ids)
        sched.signal(signal.SIGTERM)
        assert sched.wait(30) == 0, sched.text()[-3000:]
    finally:
        cluster.stop()


def test_admin_drain_grace_end_stops_at_a_round_boundary():
    cluster = u.Cluster(n_workers=1, worker_extra=[u.SPEC_ALWAYS_PAYS],
                        scheduler_extra=["--drain_grace_seconds=1",
                                         "--max_running=2"], metrics=True)
    try:
        c = cluster.client
        sid = c.call("specserve.v1.Sessions/OpenSession",
                     capacity=4096).session_id
        one_shot = u.Stream(c, _long(P1, 4000, 0))
        turn = u.Stream(c, dict(_long(P2, 4000, 3),
                                session={"session_id": sid}))
        for s in (one_shot, turn):
            s.wait_tokens(1)
        queued = u.Stream(c, _long(P1, 8, 0))
        u.wait_until(lambda: u.metric(cluster.scheduler,
                                      "vllm:num_requests_waiting") == 1,
                     what="a request queued behind the two")
        assert c.call("specserve.v1.Admin/Drain").in_flight == 3
        a, b = one_shot.join(15), turn.join(15)
        _cut_at_a_round_boundary(a, 4000)
        _cut_at_a_round_boundary(b, 4000)
        # The queued one never ran: it may be sent elsewhere.
        q = queued.join(15)
        assert q.code == grpc.StatusCode.UNAVAILABLE and "draining" in \
            q.details and not q.ids, q
        assert a.ids[:64] == u.specgen(P1, 64, ignore_eos=True)
        assert b.ids[:64] == u.specgen(P2, 64, ignore_eos=True)
        _stays_up(cluster.scheduler, c)
        # The session kept exactly what its client was sent, parked on the
        # worker, whose copy agrees; the one-shot session was freed.
        info = _session(c, sid)
        assert u.enum_name(info, "residency") == "PARKED", info
        assert info.committed_tokens == len(P2) + len(b.ids)
        u.wait_worker_idle(cluster, 0, sessions=1)
        state = cluster.worker_client(0).call(
            "specserve.worker.v1.Worker/GetSessionState", session_id=sid,
            owner=u.WORKER_OWNER)
        assert state.committed_len == info.committed_tokens
        cluster.scheduler.signal(signal.SIGTERM)
        assert cluster.scheduler.wait(30) == 0, \
            cluster.scheduler.text()[-3000:]
    finally:
        cluster.stop()
