"""docs/RELIABILITY.md row 15: graceful drain on SIGTERM. Health turns
NOT_SERVING, new work is refused UNAVAILABLE, in-flight requests finish
within the grace period (exactly, with all their tokens), then the process
exits 0. A request that cannot finish in the grace period is cut off rather
than holding the process up."""
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
        st = u.Stream(cluster.client, _long(P1, 4000, 0))
        st.wait_tokens(1)
        cluster.scheduler.signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert cluster.scheduler.wait(15) == 0, \
            cluster.scheduler.text()[-3000:]
        r = st.join(15)
        assert not (r.ok and len(r.ids) >= 4000), r
        assert r.ended_at - signalled < 5
        # The worker stops the orphaned burst and frees its session.
        u.wait_worker_idle(cluster, 0, sessions=0)
    finally:
        cluster.stop()
