"""docs/RELIABILITY.md row 8: NaN logits in one request (fault injection). That
request ends with an error status, concurrent requests are unaffected, and
its session is not parked with the poisoned caches: it is reported LOST and
rebuilt from its history on the next turn, exactly.

Injection is test-only on both sides: the worker honours
BurstRequest.inject_nan_at only with --enable_fault_injection, and the
scheduler forwards the request metadata "x-specserve-inject-nan-at" (the n-th
generated token of the request) only with its own --enable_fault_injection."""
import grpc
import pytest

import e2e_util as u

P1 = u.prompt_ids(51, 8)
P2 = u.prompt_ids(52, 6)
INJECT = "x-specserve-inject-nan-at"


@pytest.fixture(scope="module")
def cluster():
    c = u.Cluster(n_workers=1,
                  worker_extra=[u.SPEC_ALWAYS_PAYS,
                                "--enable_fault_injection"],
                  scheduler_extra=["--enable_fault_injection"])
    # A scheduler without the flag, on the same worker.
    c.plain = c.client_for(c.add_scheduler([c.workers[0].address]))
    yield c
    c.stop()


def _turn(sid, ids, k, max_tokens=12):
    return {"token_ids": {"ids": ids}, "session": {"session_id": sid},
            "stopping": {"max_tokens": max_tokens, "ignore_eos": True},
            "speculation": {"enable": k > 0, "k": k},
            "response": {"ids": True}}


def _get(c, sid):
    return c.call("specserve.v1.Sessions/GetSession", session_id=sid)


@pytest.mark.parametrize("k,at", [(0, 1), (0, 5), (3, 1), (3, 7), (2, 40)])
def test_nan_fails_the_request_not_the_others(cluster, k, at):
    c = cluster.client
    sid = c.call("specserve.v1.Sessions/OpenSession").session_id
    first = u.generate_ok(c, _turn(sid, P1, k))
    history = P1 + list(first.ids)
    # A bystander streams on the same worker meanwhile.
    bystander = u.Stream(c, {"token_ids": {"ids": P2},
                             "stopping": {"max_tokens": 600,
                                          "ignore_eos": True},
                             "speculation": {"enable": True, "k": 3}})
    bystander.wait_tokens(1)
    bad = u.generate(c, _turn(sid, P2, k, max_tokens=60),
                     metadata={INJECT: str(at)})
    assert bad.code == grpc.StatusCode.INTERNAL, bad
    assert "non-finite" in bad.details, bad.details
    # The tokens before the poisoned one were streamed (and are exact).
    assert len(bad.ids) < at
    ref = u.specgen(history + P2, at, ignore_eos=True)
    assert list(bad.ids) == ref[:len(bad.ids)]
    # Not parked: the poisoned copy is gone and the session says LOST.
    info = _get(c, sid)
    assert u.enum_name(info, "residency") == "LOST", info
    assert info.committed_tokens == len(history) + len(P2) + len(bad.ids) \
        if bad.ids else info.committed_tokens in (
            len(history), len(history) + len(P2))
    other = bystander.join()
    assert other.ok and len(other.ids) >= 600, other
    assert other.ids[:80] == u.specgen(P2, 80, ignore_eos=True)
    u.wait_worker_idle(cluster, 0, sessions=0)
    # The next turn rebuilds the session from its history, exactly.
    whole = history[:]
    if info.committed_tokens > len(history):
        whole += P2 + list(bad.ids)
    nxt = u.generate_ok(c, _turn(sid, P1, k))
    u.assert_matches_reference(whole + P1, nxt, 12, ignore_eos=True)
    assert _get(c, sid).committed_tokens == len(whole) + len(P1) + \
        len(nxt.ids)
    c.call("specserve.v1.Sessions/CloseSession", session_id=sid)
    u.wait_worker_idle(cluster, 0, sessions=0)


def test_rewind_after_nan_regenerates_from_checkpoint(cluster):
    """REWIND on the LOST session: rebuilt at the prompt checkpoint, and the
    partial poisoned reply leaves the history."""
    c = cluster.client
    sid = c.call("specserve.v1.Sessions/OpenSession").session_id
    first = u.generate_ok(c, _turn(sid, P1, 3))
    history = P1 + list(first.ids)
    bad = u.generate(c, _turn(sid, P2, 3), metadata={INJECT: "6"})
    assert bad.code == grpc.StatusCode.INTERNAL and bad.ids, bad
    checkpoint = len(history) + len(P2)
    assert _get(c, sid).rewind_pos == checkpoint
    regen = u.generate_ok(c, {"session": {"session_id": sid,
                                          "mode": "REWIND"},
                              "stopping": {"max_tokens": 12,
                                           "ignore_eos": True},
                              "speculation": {"enable": True, "k": 3},
                              "response": {"ids": True}})
    u.assert_matches_reference(history + P2, regen, 12, ignore_eos=True)
    info = _get(c, sid)
    assert info.committed_tokens == checkpoint + len(regen.ids)
    assert info.rewind_pos == checkpoint
    whole = history + P2 + list(regen.ids)
    nxt = u.generate_ok(c, _turn(sid, P1, 3, max_tokens=8))
    u.assert_matches_reference(whole + P1, nxt, 8, ignore_eos=True)
    c.call("specserve.v1.Sessions/CloseSession", session_id=sid)


def test_injection_needs_the_scheduler_flag(cluster):
    r = u.generate(cluster.plain, {"token_ids": {"ids": P1},
                                   "stopping": {"max_tokens": 8}},
                   metadata={INJECT: "2"})
    assert r.ok, r
    u.assert_matches_reference(P1, r, 8)


def test_malformed_injection_metadata_is_refused(cluster):
    r = u.generate(cluster.client, {"token_ids": {"ids": P1}},
                   metadata={INJECT: "soon"})
    assert r.code == grpc.StatusCode.INVALID_ARGUMENT, r
