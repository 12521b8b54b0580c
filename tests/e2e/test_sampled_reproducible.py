"""Seeded sampled output is a function of (seed, history): the same tokens
whatever the burst length, speculation and its k, the turn boundaries, a
demotion to plain decode, or a rebuild on another worker after the first one
died (each token is drawn at the uniform of its position,
worker/spec/spec_accept.h)."""
import pytest

import e2e_util as u

PROMPT = u.prompt_ids(5, 10)
SAMPLING = {"temperature": 0.9, "top_p": 0.95, "seed": 987654321}
N = 40


def _request(prompt, n, k, session=None):
    req = {"token_ids": {"ids": prompt},
           "sampling": SAMPLING,
           "stopping": {"max_tokens": n, "ignore_eos": True},
           "speculation": {"enable": k > 0, "k": k},
           "response": {"ids": True}}
    if session is not None:
        req["session"] = {"session_id": session}
    return req


def _one_shot(client, k):
    return list(u.generate_ok(client, _request(PROMPT, N, k)).ids)[:N]


@pytest.fixture(scope="module")
def cluster():
    c = u.Cluster(n_workers=2, worker_extra=[u.SPEC_ALWAYS_PAYS])
    yield c
    c.stop()


@pytest.fixture(scope="module")
def reference(cluster):
    """Plain sampled decoding, one request."""
    return _one_shot(cluster.client, 0)


def test_speculation_and_k_do_not_change_the_tokens(cluster, reference):
    assert len(reference) == N
    for k in (1, 3, 5):
        assert _one_shot(cluster.client, k) == reference, k


def test_burst_length_does_not_change_the_tokens(cluster, reference):
    s = cluster.add_scheduler([w.address for w in cluster.workers],
                              extra=["--burst_tokens=3"])
    c = cluster.client_for(s)
    assert _one_shot(c, 3) == reference
    assert _one_shot(c, 0) == reference


def test_turns_and_a_rebuild_do_not_change_the_tokens(cluster, reference):
    c = cluster.client
    sid = c.call("specserve.v1.Sessions/OpenSession", capacity=256).session_id
    first = list(u.generate_ok(c, _request(PROMPT, 15, 3, sid)).ids)
    assert first == reference[:len(first)]
    # Kill the worker holding the session: the next turn rebuilds it on the
    # other worker from its history and draws the same tokens from there.
    holder = c.call("specserve.v1.Sessions/GetSession",
                    session_id=sid).worker
    dead = u.worker_index_by_address(cluster, holder)
    cluster.workers[dead].stop()
    try:
        rest = list(u.generate_ok(
            c, _request([], N - len(first), 2, sid)).ids)
        got = (first + rest)[:N]
        assert got == reference
    finally:
        cluster.restart_worker(dead)
        u.wait_until(lambda: all(w.available for w in c.call(
            "specserve.v1.Admin/GetServerInfo").workers), timeout=20,
            what="worker back")


def test_demotion_does_not_change_the_tokens(reference):
    # Step costs under which speculation never pays: the gate demotes the
    # speculative request to plain decode after its first decision.
    decode = ",".join(["0.0100"] * 16)
    verify = ",".join(["0.0500"] * 9)
    c = u.Cluster(n_workers=1,
                  worker_extra=["--step_costs=decode=%s;verify=%s"
                                % (decode, verify)],
                  scheduler_extra=["--burst_tokens=4"])
    try:
        r = u.generate_ok(c.client, dict(_request(PROMPT, N, 3),
                                         response={"ids": True,
                                                   "spec_stats": True}))
        assert r.final.spec_stats.demoted, r
        assert list(r.ids)[:N] == reference
    finally:
        c.stop()
