"""Workers that hang, die or restart, as the scheduler sees them
(docs/RELIABILITY.md rows 1 and 2, docs/DESIGN.md §2 residency):

- a frozen worker (SIGSTOP) gets no new work once its health fails, and a
  request that was sent to it just before anyone noticed moves to the other
  worker within 2 s of the poll that noticed: one-shot requests and a turn
  of a session parked on the frozen worker all finish, exactly, at once;
- a worker that is merely slow (frozen for less than --worker_lost_after_ms)
  keeps its parked sessions and resumes them from its cache; one silent for
  longer has them marked LOST and, once it answers again, their copies
  released before it takes work;
- the sessions of a worker that dies show LOST (GetSession, ListSessions,
  specserve_sessions{residency="lost"}) as soon as the scheduler sees it
  gone, and those of a restarted worker too; their next turn rebuilds them
  and continues exactly;
- a session the worker's pool drops on its own (host-memory pressure) shows
  LOST as well, not the OFFLOADED it was parked as."""
import signal
import time

import pytest

import e2e_util as u

PROMPT = u.prompt_ids(31, 9)
# The frozen worker is noticed by a health poll that times out: up to one
# poll interval plus the poll deadline (1 s) after the stop. Each request
# must end within 2 s of that (RELIABILITY row 2).
NOTICED_WITHIN = 1.5
MOVED_WITHIN = NOTICED_WITHIN + 2.0
# Seconds a silent worker keeps its sessions (the scheduler's
# --worker_lost_after_ms): longer than the frozen-worker test's stop.
LOST_AFTER = 4


@pytest.fixture(scope="module")
def cluster():
    c = u.Cluster(n_workers=2, worker_extra=[u.SPEC_ALWAYS_PAYS],
                  scheduler_extra=["--worker_lost_after_ms=%d"
                                   % (LOST_AFTER * 1000)],
                  metrics=True)
    yield c
    for w in c.workers:
        w.signal(signal.SIGCONT)
    c.stop()


@pytest.fixture(autouse=True)
def all_workers_up(cluster):
    """Each test starts with both workers alive and available, and no
    session open."""
    for i, w in enumerate(cluster.workers):
        w.signal(signal.SIGCONT)
        if w.popen.poll() is not None:
            cluster.restart_worker(i)
    u.wait_until(lambda: all(w.available for w in _info(cluster.client)
                             .workers), timeout=15, what="workers available")
    yield
    for s in cluster.client.call("specserve.v1.Sessions/ListSessions") \
            .sessions:
        cluster.client.call("specserve.v1.Sessions/CloseSession",
                            session_id=s.session_id)


def _info(c):
    return c.call("specserve.v1.Admin/GetServerInfo")


def _session(c, sid):
    return c.call("specserve.v1.Sessions/GetSession", session_id=sid)


def _residency(c, sid):
    return u.enum_name(_session(c, sid), "residency")


def _turn(sid, ids, n, k=2):
    req = {"token_ids": {"ids": ids}, "stopping": {"max_tokens": n,
                                                  "ignore_eos": True},
           "speculation": {"enable": k > 0, "k": k},
           "response": {"ids": True}}
    if sid is not None:
        req["session"] = {"session_id": sid}
    return req


def _open_with_turn(c, prompt, n=8, k=2):
    sid = c.call("specserve.v1.Sessions/OpenSession").session_id
    r = u.generate_ok(c, _turn(sid, prompt, n, k))
    return sid, prompt + list(r.ids)


def _wait_polled(cluster, sessions):
    """Waits until the scheduler's last polls show `sessions` (a list, by
    worker): placement ranks workers by what the polls reported."""
    u.wait_until(lambda: [w.sessions for w in _info(cluster.client).workers]
                 == sessions, timeout=5, what="polls showing %s" % sessions)


def _worker_of(cluster, sid):
    return u.worker_index_by_address(cluster, _session(cluster.client,
                                                       sid).worker)


def test_requests_leave_a_frozen_worker(cluster):
    c = cluster.client
    # One session parked on each worker, of the same shape (plain decode:
    # no overshoot): equal loads, so new sessions go to worker 0 (the lower
    # index), the one frozen, until the scheduler notices.
    parked, history = _open_with_turn(c, PROMPT, k=0)
    assert _worker_of(cluster, parked) == 0
    _wait_polled(cluster, [1, 0])
    other_sid, _ = _open_with_turn(c, u.prompt_ids(32, 9), k=0)
    assert _worker_of(cluster, other_sid) == 1
    _wait_polled(cluster, [1, 1])
    assert cluster.worker_info(0).memory_used_bytes == \
        cluster.worker_info(1).memory_used_bytes
    frozen = 0
    prompts = [u.prompt_ids(40 + i, 7) for i in range(5)]
    cluster.workers[frozen].signal(signal.SIGSTOP)
    try:
        stopped_at = time.monotonic()
        streams = [u.Stream(c, _turn(None, p, 6), timeout=30)
                   for p in prompts[:3]]
        turn = u.Stream(c, _turn(parked, [7, 8, 9], 6), timeout=30)
        time.sleep(0.5)  # still before the health poll noticed
        streams += [u.Stream(c, _turn(None, p, 6), timeout=30)
                    for p in prompts[3:]]
        results = [s.join(40) for s in streams]
        t = turn.join(40)
        for p, r in zip(prompts, results):
            assert r.ok, r
            assert r.ended_at - stopped_at < MOVED_WITHIN, r
            u.assert_matches_reference(p, r, 6, ignore_eos=True)
        assert t.ok, t
        assert t.ended_at - stopped_at < MOVED_WITHIN, t
        whole = history + [7, 8, 9]
        u.assert_matches_reference(whole, t, 6, ignore_eos=True)
        info = _session(c, parked)
        assert info.worker == cluster.workers[1 - frozen].address, info
        assert not _info(c).workers[frozen].available
        # Placement never picks the frozen worker while it stays frozen.
        late = u.generate_ok(c, _turn(None, prompts[0], 6), timeout=30)
        u.assert_matches_reference(prompts[0], late, 6, ignore_eos=True)
    finally:
        cluster.workers[frozen].signal(signal.SIGCONT)
    u.wait_until(lambda: _info(c).workers[frozen].available, timeout=15,
                 what="the continued worker rejoins")
    # Nothing given up on is left on it: the one-shots' admits and the
    # parked session's copy are released before it takes work again.
    u.wait_worker_idle(cluster, frozen, sessions=0)


def _freeze_until(cluster, i, predicate, what):
    """SIGSTOPs worker i until `predicate()` holds; SIGCONTs it and waits
    until it is available again."""
    c = cluster.client
    cluster.workers[i].signal(signal.SIGSTOP)
    try:
        u.wait_until(predicate, timeout=LOST_AFTER + 10, what=what)
    finally:
        cluster.workers[i].signal(signal.SIGCONT)
    u.wait_until(lambda: _info(c).workers[i].available, timeout=15,
                 what="the continued worker rejoins")


def test_slow_worker_keeps_its_sessions_until_lost_after(cluster):
    c = cluster.client
    sid, history = _open_with_turn(c, u.prompt_ids(35, 8))
    slow = _worker_of(cluster, sid)
    address = cluster.workers[slow].address
    # Unavailable for a moment: the session stays parked there...
    _freeze_until(cluster, slow, lambda: not _info(c).workers[slow]
                  .available, "the frozen worker unavailable")
    info = _session(c, sid)
    assert u.enum_name(info, "residency") == "PARKED" and \
        info.worker == address, info
    # ...and resumes from its cache there, with no prefill.
    r = u.generate_ok(c, _turn(sid, [3, 4], 6))
    assert r.final.usage.cached_prompt_tokens == len(history)
    u.assert_matches_reference(history + [3, 4], r, 6, ignore_eos=True)
    assert _session(c, sid).worker == address
    history += [3, 4] + list(r.ids)
    # Silent past lost_after: LOST, and its copy is released once the
    # worker answers, before it takes work again.
    _freeze_until(cluster, slow, lambda: _residency(c, sid) == "LOST",
                  "the silent worker's session LOST")
    assert cluster.worker_info(slow).sessions == 0
    r = u.generate_ok(c, _turn(sid, [5], 6))
    u.assert_matches_reference(history + [5], r, 6, ignore_eos=True)


def _lost_gauge(cluster):
    return u.scrape(cluster.scheduler).get(
        'specserve_sessions{residency="lost"}', 0.0)


def _parked_gauge(cluster):
    return u.scrape(cluster.scheduler).get(
        'specserve_sessions{residency="parked"}', 0.0)


def test_dead_and_restarted_workers_sessions_show_lost(cluster):
    c = cluster.client
    sessions = []
    for i in range(4):  # spread over both workers, by the polled loads
        sessions.append(_open_with_turn(c, u.prompt_ids(50 + i, 8)))
        u.wait_until(lambda: sum(w.sessions for w in _info(c).workers)
                     == len(sessions), timeout=5, what="polled sessions")
    dead = _worker_of(cluster, sessions[0][0])
    on_dead = [(s, h) for s, h in sessions if _worker_of(cluster, s) == dead]
    alive = [s for s, _ in sessions if _worker_of(cluster, s) != dead]
    assert on_dead and alive
    killed_at = time.monotonic()
    cluster.workers[dead].signal(signal.SIGKILL)
    cluster.workers[dead].wait(5)

    def all_lost():
        listed = {s.session_id: u.enum_name(s, "residency") for s in
                  c.call("specserve.v1.Sessions/ListSessions").sessions}
        return all(listed[s] == "LOST" and _residency(c, s) == "LOST"
                   for s, _ in on_dead)
    u.wait_until(all_lost, timeout=3, what="the dead worker's sessions LOST")
    assert time.monotonic() - killed_at < 2.5
    for s in alive:
        assert _residency(c, s) == "PARKED"
    u.wait_until(lambda: _lost_gauge(cluster) == len(on_dead), timeout=3,
                 what="specserve_sessions{residency=lost}")
    assert _parked_gauge(cluster) == len(alive)
    # The next turn rebuilds a lost session on the live worker, exactly.
    sid, history = on_dead[0]
    r = u.generate_ok(c, _turn(sid, [11, 12], 6))
    u.assert_matches_reference(history + [11, 12], r, 6, ignore_eos=True)
    assert _residency(c, sid) == "PARKED"

    # Restarted on the same port: sessions parked there before are LOST
    # (the new process holds none of them), then rebuilt exactly.
    cluster.restart_worker(dead)
    u.wait_until(lambda: _info(c).workers[dead].available, timeout=15,
                 what="the restarted worker rejoins")
    sid2, history2 = _open_with_turn(c, u.prompt_ids(60, 8))
    if _worker_of(cluster, sid2) != dead:  # the lower load went elsewhere
        sid2, history2 = _open_with_turn(c, u.prompt_ids(61, 8))
    restarted = _worker_of(cluster, sid2)
    cluster.workers[restarted].signal(signal.SIGKILL)
    cluster.workers[restarted].wait(5)
    cluster.restart_worker(restarted)
    u.wait_until(lambda: _residency(c, sid2) == "LOST", timeout=15,
                 what="a session of the restarted worker LOST")
    r2 = u.generate_ok(c, _turn(sid2, [13, 14], 6))
    u.assert_matches_reference(history2 + [13, 14], r2, 6, ignore_eos=True)
    assert _residency(c, sid2) == "PARKED"


@pytest.fixture(scope="module")
def dropping():
    """One worker whose pool holds two parked sessions' snapshots, not three
    (as in test_memory_pressure.py)."""
    c = u.Cluster(n_workers=1, worker_extra=[u.SPEC_ALWAYS_PAYS],
                  per_worker_extra=[["--memory_budget_mb=0",
                                     "--host_budget_mb=1"]])
    yield c
    c.stop()


def test_pool_drop_shows_lost(dropping):
    c = dropping.client
    # Each park offloads (no device budget); the parks past the host budget
    # push the least recently used sessions out.
    sessions = [_open_with_turn(c, u.prompt_ids(70 + i, 6), n=10)
                for i in range(3)]
    held = dropping.worker_info(0).sessions
    assert held < 3

    def shown():
        return [_residency(c, s) for s, _ in sessions]
    u.wait_until(lambda: shown().count("LOST") == 3 - held, timeout=3,
                 what="the dropped sessions LOST")
    assert shown() == ["LOST"] * (3 - held) + ["OFFLOADED"] * held
    sid, history = sessions[0]
    r = u.generate_ok(c, _turn(sid, [21, 22], 6))
    u.assert_matches_reference(history + [21, 22], r, 6, ignore_eos=True)
