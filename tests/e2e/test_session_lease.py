"""Orphaned sessions: a worker releases every idle session once no
scheduler has called for --session_lease_seconds, so a scheduler that exits
leaves no caches behind (memory back to the idle baseline); a scheduler that
keeps polling keeps its parked sessions however long they sit idle."""
import signal
import time

import pytest

import e2e_util as u

LEASE_SECONDS = 2


def _turn(sid, ids, n):
    return {"token_ids": {"ids": ids}, "session": {"session_id": sid},
            "stopping": {"max_tokens": n, "ignore_eos": True},
            "speculation": {"enable": True, "k": 2},
            "response": {"ids": True}}


def _open_sessions(c, n, seed):
    """n sessions with two turns each; returns [(id, history)]."""
    out = []
    for i in range(n):
        sid = c.call("specserve.v1.Sessions/OpenSession").session_id
        prompt = u.prompt_ids(seed + i, 7)
        r1 = u.generate_ok(c, _turn(sid, prompt, 6))
        r2 = u.generate_ok(c, _turn(sid, [5, 6], 6))
        out.append((sid, prompt + list(r1.ids) + [5, 6] + list(r2.ids)))
    return out


def _kill_scheduler(cluster):
    s = cluster.scheduler
    s.signal(signal.SIGKILL)
    s.wait(10)


def _wait_released(cluster, baseline):
    u.wait_until(lambda: cluster.worker_info(0).sessions == 0, timeout=15,
                 what="the worker released the orphaned sessions")
    assert cluster.worker_info(0).memory_used_bytes == baseline


@pytest.fixture()
def leased():
    c = u.Cluster(n_workers=1, worker_extra=[
        u.SPEC_ALWAYS_PAYS, "--session_lease_seconds=%d" % LEASE_SECONDS])
    yield c
    c.stop()


def test_polled_sessions_outlive_the_lease(leased):
    """Control: the scheduler polls, so three lease times later its parked
    sessions are all still there, and a next turn resumes from the cache."""
    c = leased.client
    sessions = _open_sessions(c, 3, seed=100)
    assert leased.worker_info(0).sessions == 3
    time.sleep(3 * LEASE_SECONDS)
    assert leased.worker_info(0).sessions == 3
    sid, history = sessions[0]
    assert u.enum_name(c.call("specserve.v1.Sessions/GetSession",
                              session_id=sid), "residency") == "PARKED"
    r = u.generate_ok(c, _turn(sid, [9], 4))
    assert r.final.usage.cached_prompt_tokens == len(history)
    u.assert_matches_reference(history + [9], r, 4, ignore_eos=True)


def test_orphans_are_released_after_the_lease(leased):
    baseline = leased.worker_info(0).memory_used_bytes
    _open_sessions(leased.client, 3, seed=110)
    info = leased.worker_info(0)
    assert info.sessions == 3 and info.memory_used_bytes > baseline
    # The scheduler exits: no one claims the sessions any more.
    _kill_scheduler(leased)
    _wait_released(leased, baseline)
