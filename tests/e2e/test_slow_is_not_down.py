"""Slow is not down (issue 28; docs/RELIABILITY.md rows 2, 3, 4 and 16).

- A burst its client cancels, or that passes its deadline, leaves the worker
  available: the next request succeeds at once, and GetServerInfo never
  shows the worker unavailable meanwhile, even with many concurrent streams
  cancelled and expiring together.
- A worker that stalls for less than --worker_down_after_misses poll
  deadlines (SIGSTOP for a moment: every burst on it is slow, one health poll
  misses) stays available, and its streams finish exactly.
- With two workers, one frozen (SIGSTOP) while requests run on it: streams
  that had tokens end UNAVAILABLE (the rebuild contract: their sessions keep
  what was sent and are rebuilt on the next turn), the others finish on the
  live worker; new requests go to the live worker; SIGCONT brings it back.
- A request that finds no worker (the only one frozen, or not listening yet
  when the scheduler starts) waits for one and then succeeds; past
  --no_worker_wait_ms it fails UNAVAILABLE saying what to do, and past its
  own deadline DEADLINE_EXCEEDED.

The scheduler polls every 200 ms (specserve_procs) with the default
--worker_poll_deadline_ms=500 and --worker_down_after_misses=2: a frozen
worker is marked unavailable within 0.2 + 2 x 0.5 = 1.2 s of the stop."""
import signal
import socket
import threading
import time

import grpc
import pytest

import e2e_util as u
import specserve_procs as procs
from reflection_client import ReflectionClient

PROMPT = u.prompt_ids(61, 9)
LONG = {"max_tokens": 3000, "ignore_eos": True}
# The product moves work off a frozen worker within 2 s of the stop (1.2 s to
# notice it here, then the cancel and a short prefill elsewhere). The tests
# allow 3.5 s: CI runs them on two slow, shared cores, where a process woken
# by a signal or a timer can be late by a few hundred milliseconds.
MOVED_WITHIN = 3.5


def _info(c):
    return c.call("specserve.v1.Admin/GetServerInfo")


def _session(c, sid):
    return c.call("specserve.v1.Sessions/GetSession", session_id=sid)


def _turn(sid, ids, stopping, k=0):
    req = {"token_ids": {"ids": ids}, "stopping": stopping,
           "speculation": {"enable": k > 0, "k": k},
           "response": {"ids": True}}
    if sid is not None:
        req["session"] = {"session_id": sid}
    return req


def _short(ids, n=6, sid=None):
    return _turn(sid, ids, {"max_tokens": n, "ignore_eos": True})


class AvailabilityWatch:
    """Reads GetServerInfo every 20 ms on a thread of its own and records
    every moment a worker was not available."""

    def __init__(self, client):
        self.client = client
        self.unavailable = []  # (seconds since start, index, detail)
        self.reads = 0
        self._stop = threading.Event()
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            for i, w in enumerate(_info(self.client).workers):
                if not w.available:
                    self.unavailable.append(
                        (time.monotonic() - self._start, i, w.detail))
            self.reads += 1
            self._stop.wait(0.02)

    def stop(self):
        self._stop.set()
        self._thread.join(10)
        assert self.reads >= 2, "the watch never ran"
        return self.unavailable


# ---------------------------------------------------------------------------
# (a) One worker: cancels, deadlines and stalls leave it available


@pytest.fixture(scope="module")
def one():
    c = u.Cluster(n_workers=1, worker_extra=[u.SPEC_ALWAYS_PAYS])
    yield c
    c.workers[0].signal(signal.SIGCONT)
    c.stop()


def test_cancelled_and_expired_bursts_leave_the_worker_available(one):
    c = one.client
    watch = AvailabilityWatch(c)
    try:
        sid = c.call("specserve.v1.Sessions/OpenSession",
                     capacity=4096).session_id
        st = u.Stream(c, _turn(sid, PROMPT, LONG, k=2))
        st.wait_tokens(8)
        st.cancel()
        r = st.join(10)
        assert r.code == grpc.StatusCode.CANCELLED, r
        # Stopped at a round boundary and parked (the client heard of its
        # cancel at once, the scheduler parks it just after)...
        u.wait_until(lambda: not _session(c, sid).busy, timeout=5,
                     what="the cancelled turn parked")
        assert u.enum_name(_session(c, sid), "residency") == "PARKED"
        # ...and the next turn runs at once, on the same worker, from its
        # cache.
        t0 = time.monotonic()
        nxt = u.generate_ok(c, _short([5, 6], sid=sid))
        assert time.monotonic() - t0 < 5.0
        assert nxt.final.usage.cached_prompt_tokens > 0, nxt
        # A burst that passes its deadline.
        expired = u.Stream(c, _turn(None, PROMPT, LONG), timeout=1.0)
        r = expired.join(15)
        assert r.code == grpc.StatusCode.DEADLINE_EXCEEDED, r
        t0 = time.monotonic()
        ok = u.generate_ok(c, _short(PROMPT))
        assert time.monotonic() - t0 < 5.0
        u.assert_matches_reference(PROMPT, ok, 6, ignore_eos=True)
        assert _info(c).workers[0].available
        c.call("specserve.v1.Sessions/CloseSession", session_id=sid)
    finally:
        down = watch.stop()
    assert not down, "worker shown unavailable: %s" % down[:5]


def test_many_cancels_and_deadlines_at_once(one):
    """16 concurrent streams (as in issue 28's c=16 run): a third cancelled
    mid-stream, a third expiring, a third running to the end. None of it
    makes the worker unavailable, and the finished ones are exact."""
    c = one.client
    watch = AvailabilityWatch(c)
    try:
        prompts = [u.prompt_ids(70 + i, 6) for i in range(16)]
        streams = []
        for i, p in enumerate(prompts):
            if i % 3 == 0:
                streams.append(u.Stream(c, _turn(None, p, LONG)))
            elif i % 3 == 1:
                streams.append(u.Stream(c, _turn(None, p, LONG),
                                        timeout=2.0))
            else:
                streams.append(u.Stream(c, _short(p, 24), timeout=60))
        for i, s in enumerate(streams):
            if i % 3 == 0:
                s.wait_tokens(2)
                s.cancel()
        for i, (p, s) in enumerate(zip(prompts, streams)):
            r = s.join(60)
            want = [grpc.StatusCode.CANCELLED,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    grpc.StatusCode.OK][i % 3]
            assert r.code == want, (i, r)
            if i % 3 == 2:
                u.assert_matches_reference(p, r, 24, ignore_eos=True)
        t0 = time.monotonic()
        u.generate_ok(c, _short(PROMPT))
        assert time.monotonic() - t0 < 5.0
    finally:
        down = watch.stop()
    assert not down, "worker shown unavailable: %s" % down[:5]
    u.wait_worker_idle(one, 0, sessions=0, timeout=15)


# A poll deadline of 1 s, and stalls that one poll always misses (sent at
# most 0.2 s + scheduling slack into the stall) and the next one, sent at
# once, never does (the worker answers 0.4 s before its deadline).
STALL_POLL_DEADLINE = 1.0
STALL = 1.6


@pytest.fixture(scope="module")
def stalling():
    c = u.Cluster(n_workers=1, worker_extra=[u.SPEC_ALWAYS_PAYS],
                  scheduler_extra=["--worker_poll_deadline_ms=%d"
                                   % (STALL_POLL_DEADLINE * 1000)])
    yield c
    c.workers[0].signal(signal.SIGCONT)
    c.stop()


def test_a_stalled_worker_stays_available(stalling):
    """Stalls shorter than down_after_misses poll deadlines: each makes the
    running bursts slow (nothing streams for 1.6 s) and one health poll
    miss, and changes nothing else."""
    one = stalling
    c = one.client
    watch = AvailabilityWatch(c)
    try:
        streams = [u.Stream(c, _short(u.prompt_ids(90 + i, 7), 40),
                            timeout=60) for i in range(3)]
        for s in streams:
            s.wait_tokens(1)
        for _ in range(3):
            one.workers[0].signal(signal.SIGSTOP)
            time.sleep(STALL)
            one.workers[0].signal(signal.SIGCONT)
            time.sleep(0.5)
        for i, s in enumerate(streams):
            r = s.join(60)
            assert r.ok, r
            u.assert_matches_reference(u.prompt_ids(90 + i, 7), r, 40,
                                       ignore_eos=True)
    finally:
        one.workers[0].signal(signal.SIGCONT)
        down = watch.stop()
    assert not down, "worker shown unavailable: %s" % down[:5]
    assert "missed 1 health poll" in one.scheduler.text(), \
        "no poll missed: the stalls did not test anything"


# ---------------------------------------------------------------------------
# (b) Two workers: work leaves a frozen one within 2 s


@pytest.fixture(scope="module")
def two():
    c = u.Cluster(n_workers=2, worker_extra=[u.SPEC_ALWAYS_PAYS])
    yield c
    for w in c.workers:
        w.signal(signal.SIGCONT)
    c.stop()


def test_requests_leave_a_worker_frozen_mid_stream(two):
    c = two.client
    sids = [c.call("specserve.v1.Sessions/OpenSession",
                   capacity=4096).session_id for _ in range(4)]
    streams = [u.Stream(c, _turn(s, u.prompt_ids(100 + i, 8), LONG))
               for i, s in enumerate(sids)]
    for s in streams:
        s.wait_tokens(4)
    where = [u.worker_index_by_address(two, _session(c, s).worker)
             for s in sids]
    assert set(where) == {0, 1}, where  # placement spread them
    frozen = where[0]
    live = 1 - frozen
    two.workers[frozen].signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        # Sent right after the stop, before anyone noticed: wherever it is
        # placed it finishes, on the live worker, exactly.
        fresh = [u.Stream(c, _short(u.prompt_ids(110 + i, 7)), timeout=30)
                 for i in range(3)]
        for i, (s, w) in enumerate(zip(streams, where)):
            if w != frozen:
                continue
            r = s.join(15)
            # It had streamed tokens: the existing rebuild contract ends it
            # UNAVAILABLE, and its session keeps exactly what was sent.
            assert r.code == grpc.StatusCode.UNAVAILABLE, r
            assert r.ended_at - stopped_at < MOVED_WITHIN, r
            assert "retry" in r.details or "rebuilt" in r.details, r
            info = _session(c, sids[i])
            assert info.committed_tokens == 8 + len(r.ids), info
        for i, s in enumerate(fresh):
            r = s.join(30)
            assert r.ok, r
            assert r.ended_at - stopped_at < MOVED_WITHIN, r
            u.assert_matches_reference(u.prompt_ids(110 + i, 7), r, 6,
                                       ignore_eos=True)
        assert not _info(c).workers[frozen].available
        # New work goes to the live worker, at once.
        sid = c.call("specserve.v1.Sessions/OpenSession").session_id
        t0 = time.monotonic()
        u.generate_ok(c, _short(PROMPT, sid=sid))
        assert time.monotonic() - t0 < 3.0
        assert _session(c, sid).worker == two.workers[live].address
        c.call("specserve.v1.Sessions/CloseSession", session_id=sid)
        # An interrupted session continues exactly on its next turn.
        i = where.index(frozen)
        before = list(streams[i].result.ids)
        nxt = u.generate_ok(c, {"session": {"session_id": sids[i]},
                                "stopping": {"max_tokens": 6,
                                             "ignore_eos": True},
                                "response": {"ids": True}})
        whole = before + list(nxt.ids)
        assert whole == u.specgen(u.prompt_ids(100 + i, 8), len(whole),
                                  ignore_eos=True)
    finally:
        two.workers[frozen].signal(signal.SIGCONT)
    u.wait_until(lambda: _info(c).workers[frozen].available, timeout=15,
                 what="the continued worker rejoins")
    for s, w in zip(streams, where):
        if w == live:  # untouched by the other worker's freeze
            s.cancel()
            r = s.join(15)
            assert r.code in (grpc.StatusCode.CANCELLED,
                              grpc.StatusCode.OK), r
    for s in sids:
        c.call("specserve.v1.Sessions/CloseSession", session_id=s)
    for i in range(2):
        u.wait_worker_idle(two, i, sessions=0, timeout=15)


# ---------------------------------------------------------------------------
# (c) No worker for a moment: requests wait, then run


def test_requests_wait_out_a_frozen_only_worker(one):
    c = one.client
    w = one.workers[0]
    for freeze in (0.9, 2.5):  # shorter, then longer than it takes to notice
        prompts = [u.prompt_ids(120 + i, 7) for i in range(3)]
        w.signal(signal.SIGSTOP)
        try:
            stopped_at = time.monotonic()
            streams = [u.Stream(c, _short(p), timeout=30) for p in prompts]
            time.sleep(freeze)
            if freeze > 2:
                # Noticed: the worker shows unavailable, and a request sent
                # now waits at the door instead of failing at once.
                assert not _info(c).workers[0].available
                prompts.append(u.prompt_ids(130, 7))
                streams.append(u.Stream(c, _short(prompts[-1]), timeout=30))
                time.sleep(0.3)
        finally:
            w.signal(signal.SIGCONT)
        for p, s in zip(prompts, streams):
            r = s.join(30)
            assert r.ok, (freeze, r)
            assert r.ended_at - stopped_at < freeze + 5.0, (freeze, r)
            u.assert_matches_reference(p, r, 6, ignore_eos=True)
        u.wait_until(lambda: _info(c).workers[0].available, timeout=10,
                     what="the worker available again")
    u.wait_worker_idle(one, 0, sessions=0, timeout=15)


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_scheduler_started_before_its_worker():
    port = _free_port()
    address = "127.0.0.1:%d" % port
    # Long enough for a worker to start on a loaded CI machine.
    s = procs.start_scheduler([address], model=u.DEFAULT_MODEL, extra=[
        "--no_worker_wait_ms=30000", "--worker_owner=" + u.WORKER_OWNER])
    worker = None
    c = None
    try:
        c = ReflectionClient(s.address)
        assert not _info(c).workers[0].available
        streams = [u.Stream(c, _short(u.prompt_ids(140 + i, 7)), timeout=45)
                   for i in range(2)]
        time.sleep(0.5)
        assert all(st.result.ended_at is None for st in streams), \
            [st.result for st in streams]
        worker = procs.start_worker(model=u.DEFAULT_MODEL, port=port,
                                    extra=["--threads=1", u.SPEC_ALWAYS_PAYS])
        for i, st in enumerate(streams):
            r = st.join(45)
            assert r.ok, r
            u.assert_matches_reference(u.prompt_ids(140 + i, 7), r, 6,
                                       ignore_eos=True)
    finally:
        if c is not None:
            c.close()
        s.stop()
        if worker is not None:
            worker.stop()


def test_no_worker_past_the_wait_fails_unavailable():
    address = "127.0.0.1:%d" % _free_port()  # nothing listens there
    s = procs.start_scheduler([address], model=u.DEFAULT_MODEL,
                              extra=["--no_worker_wait_ms=1500"])
    c = None
    try:
        c = ReflectionClient(s.address)
        r = u.generate(c, _short(PROMPT), timeout=20)
        assert r.code == grpc.StatusCode.UNAVAILABLE, r
        waited = r.ended_at - r.started
        assert 1.4 <= waited < 6.0, r
        # Says what happened and what to do.
        for part in ("no worker available", "--no_worker_wait_ms", address,
                     "retry", "GetServerInfo"):
            assert part in r.details, (part, r.details)
        # The request's own deadline ends the wait sooner.
        r = u.generate(c, _short(PROMPT), timeout=0.5)
        assert r.code == grpc.StatusCode.DEADLINE_EXCEEDED, r
        assert r.ended_at - r.started < 1.4, r
    finally:
        if c is not None:
            c.close()
        s.stop()
