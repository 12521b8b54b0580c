"""Placement over several workers (scheduler/placement.h): new sessions
spread evenly by the scheduler's live counts even when they arrive faster
than the workers' polls, a worker whose memory budget one more session
would pass gets none while the others have room, and sessions whose first
turns share a system prompt spread too: a prefix hit is worth the prefill it
saves, not an unbounded pile-up on the worker that holds it."""
import threading

import e2e_util as u

SESSIONS = 30
CAPACITY = 64


def _open_and_turn(c, i):
    sid = c.call("specserve.v1.Sessions/OpenSession",
                 capacity=CAPACITY).session_id
    u.generate_ok(c, {"token_ids": {"ids": u.prompt_ids(100 + i, 6)},
                      "session": {"session_id": sid},
                      "stopping": {"max_tokens": 2, "ignore_eos": True},
                      "response": {"ids": True}})
    return sid


def _open_all(c, threads=6):
    sids = [None] * SESSIONS
    errors = []

    def run(k):
        try:
            for i in range(k, SESSIONS, threads):
                sids[i] = _open_and_turn(c, i)
        except Exception as e:  # reported below, with the others
            errors.append(e)

    ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errors, errors
    return sids


def _by_worker(c, sids):
    counts = {}
    for sid in sids:
        info = c.call("specserve.v1.Sessions/GetSession", session_id=sid)
        assert u.enum_name(info, "residency") == "PARKED", info
        counts[info.worker] = counts.get(info.worker, 0) + 1
    return counts


def test_thirty_sessions_spread_evenly_over_three_workers():
    cluster = u.Cluster(n_workers=3)
    try:
        c = cluster.client
        counts = _by_worker(c, _open_all(c))
        assert sorted(counts) == sorted(w.address for w in cluster.workers)
        even = SESSIONS / len(cluster.workers)
        assert all(abs(n - even) <= 2 for n in counts.values()), counts
    finally:
        cluster.stop()


def test_a_worker_at_its_budget_gets_no_more_sessions():
    # Worker 0's budget holds a few sessions of this capacity; the others
    # have room for all. A tiny host budget turns any eviction into a drop
    # (the session would show LOST), so PARKED everywhere means none was
    # evicted to make room.
    small = ["--memory_budget_mb=32", "--host_budget_mb=1"]
    cluster = u.Cluster(n_workers=3, per_worker_extra=[small, [], []])
    try:
        c = cluster.client
        counts = _by_worker(c, _open_all(c, threads=1))
        info = cluster.worker_info(0)
        assert info.memory_used_bytes <= info.memory_budget_bytes, info
        per_session = info.memory_used_bytes / max(info.sessions, 1)
        fits = int(info.memory_budget_bytes // per_session)
        assert counts.get(cluster.workers[0].address, 0) <= fits, counts
        assert sum(counts.values()) == SESSIONS
    finally:
        cluster.stop()


# A short system prompt: with a prefix checkpoint every 64 prompt rows, each
# worker that prefills it once holds the state after its first 64 tokens,
# which every later first turn starting with it can resume from.
CHECKPOINT_EVERY = 64
SYSTEM = u.prompt_ids(9000, 80)


def test_sessions_sharing_a_system_prompt_spread_over_three_workers():
    # Prefix reuse on, as the scheduler runs by default (the test clusters
    # turn it off unless asked).
    cluster = u.Cluster(
        n_workers=3,
        worker_extra=["--prefix_checkpoint_interval=%d" % CHECKPOINT_EVERY],
        scheduler_extra=["--prefix_cache_sessions=16"])
    try:
        c = cluster.client
        sids, cached = [], []
        for i in range(SESSIONS):
            sid = c.call("specserve.v1.Sessions/OpenSession",
                         capacity=256).session_id
            prompt = SYSTEM + u.prompt_ids(300 + i, 8)
            r = u.generate_ok(c, {"token_ids": {"ids": prompt},
                                  "session": {"session_id": sid},
                                  "stopping": {"max_tokens": 2,
                                               "ignore_eos": True},
                                  "response": {"ids": True}})
            assert r.final.usage.cached_prompt_tokens in (
                0, CHECKPOINT_EVERY), r
            sids.append(sid)
            cached.append(r.final.usage.cached_prompt_tokens)
        # Every session stays open (parked where its turn ran).
        counts = _by_worker(c, sids)
        assert sorted(counts) == sorted(w.address for w in cluster.workers), (
            counts)
        even = SESSIONS / len(cluster.workers)
        assert all(abs(n - even) <= 2 for n in counts.values()), counts
        # The prefix is still reused: a worker prefills it when it gets a
        # session that starts with it and holds no copy yet, so most first
        # turns resume from it.
        misses = cached.count(0)
        assert misses <= 2 * len(cluster.workers), cached
    finally:
        cluster.stop()
