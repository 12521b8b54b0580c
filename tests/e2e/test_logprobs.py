"""Logprobs through specserve.v1 Generate (ResponseOptions.logprobs and
prompt_logprobs), on the default model with real processes: speculative and
plain runs report the same numbers bit for bit (greedy, and sampled with one
seed), every delta's logprobs are aligned with its ids (also when a stop
string cuts the output, and when no ids are returned), values are sane (the
greedy token is the most likely, top-n sorted by descending logprob then id,
probabilities sum to at most 1), prompt logprobs have the right length and
offsets (a fresh request omits the first prompt token; a session's second
turn scores every prompt token, the first by the history's last row), and an
n over 20 is refused INVALID_ARGUMENT naming the field."""
import math
import struct

import grpc
import pytest

import e2e_util as u

PROMPTS = [u.prompt_ids(seed, n) for seed, n in ((11, 6), (12, 17), (13, 29))]
MAX_TOKENS = 16
SAMPLINGS = [
    {},  # greedy
    {"temperature": 0.8, "seed": 7},
    {"temperature": 1.3, "top_k": 20, "top_p": 0.9, "seed": 99},
]


@pytest.fixture(scope="module")
def cluster():
    # Speculation always pays: the gate never demotes a speculative request
    # (the engine test covers demotion).
    c = u.Cluster(n_workers=1, worker_extra=[u.SPEC_ALWAYS_PAYS])
    yield c
    c.stop()


def _request(prompt, k, sampling=None, max_tokens=MAX_TOKENS, logprobs=5,
             **response):
    response.setdefault("ids", True)
    if logprobs is not None:
        response["logprobs"] = logprobs
    return {"token_ids": {"ids": prompt},
            "sampling": dict(sampling or {}),
            "stopping": {"max_tokens": max_tokens, "ignore_eos": True},
            "speculation": {"enable": k > 0, "k": k},
            "response": dict(response, spec_stats=True)}


def _bits(x):
    return struct.pack("<f", x)


def _key(lp):
    """A TokenLogprobs as comparable float32 bits."""
    return (lp.id, _bits(lp.logprob), tuple(lp.top_ids),
            tuple(_bits(v) for v in lp.top_logprobs))


def _assert_aligned(r, n):
    """Each delta carries one TokenLogprobs per id, for that id, with n
    alternatives sorted by descending logprob, then by id."""
    for d in r.delta_events:
        assert len(d.logprobs) == len(d.ids), d
        assert [lp.id for lp in d.logprobs] == list(d.ids), d
    assert len(r.logprobs) == r.final.usage.completion_tokens, r
    for lp in r.logprobs:
        assert len(lp.top_ids) == n and len(lp.top_logprobs) == n, lp
        pairs = list(zip(lp.top_logprobs, lp.top_ids))
        assert pairs == sorted(pairs, key=lambda p: (-p[0], p[1])), lp
        assert len(set(lp.top_ids)) == n, lp
        assert lp.logprob <= 0.0 and math.isfinite(lp.logprob), lp
        assert sum(math.exp(v) for v in lp.top_logprobs) <= 1.0 + 1e-5, lp
        if lp.id in lp.top_ids:
            assert lp.top_logprobs[list(lp.top_ids).index(lp.id)] == \
                lp.logprob, lp
        elif n:
            assert lp.logprob <= lp.top_logprobs[-1], lp


@pytest.mark.parametrize("s", range(len(SAMPLINGS)))
@pytest.mark.parametrize("k", [1, 3])
def test_speculative_equals_plain(cluster, k, s):
    sampling = SAMPLINGS[s]
    for prompt in PROMPTS:
        spec = u.generate_ok(cluster.client, _request(prompt, k, sampling))
        plain = u.generate_ok(cluster.client, _request(prompt, 0, sampling))
        assert spec.final.spec_stats.rounds > 0, spec
        assert plain.final.spec_stats.rounds == 0, plain
        _assert_aligned(spec, 5)
        _assert_aligned(plain, 5)
        # Speculation may overshoot max_tokens: compare what both have.
        n = min(len(spec.ids), len(plain.ids))
        assert n >= MAX_TOKENS
        assert spec.ids[:n] == plain.ids[:n], (prompt, sampling)
        assert [_key(x) for x in spec.logprobs[:n]] == \
            [_key(x) for x in plain.logprobs[:n]], (prompt, k, sampling)
        if not sampling:
            # Greedy picks the most likely token: the top alternative.
            for lp in spec.logprobs:
                assert lp.logprob == lp.top_logprobs[0], lp
                assert lp.logprob >= max(lp.top_logprobs), lp
            assert spec.ids[:MAX_TOKENS] == u.expected_shown(
                prompt, MAX_TOKENS, ignore_eos=True)


def test_top_n_range_and_default_off(cluster):
    prompt = PROMPTS[0]
    off = u.generate_ok(cluster.client, _request(prompt, 2, logprobs=None))
    assert off.logprobs == [] and list(off.final.prompt_logprobs) == []
    for n in (0, 1, 20):
        r = u.generate_ok(cluster.client, _request(prompt, 2, logprobs=n))
        _assert_aligned(r, n)
        assert r.ids == off.ids


def test_logprobs_without_ids_or_text(cluster):
    """Logprobs are sent whether or not ids are: the deltas then carry only
    them, one per generated token."""
    prompt = PROMPTS[1]
    with_ids = u.generate_ok(cluster.client, _request(prompt, 3))
    bare = u.generate_ok(cluster.client,
                         _request(prompt, 3, ids=False, text=False))
    assert bare.ids == [] and bare.deltas > 0
    assert [lp.id for lp in bare.logprobs] == with_ids.ids
    assert [_key(x) for x in bare.logprobs] == \
        [_key(x) for x in with_ids.logprobs]


def test_stop_string_keeps_logprobs_aligned(cluster):
    """A stop string cuts the output inside a delta: the logprobs sent are
    those of the ids sent, the last one being the token the stop string
    ends in."""
    c = cluster.client
    prompt = PROMPTS[2]
    full = u.generate_ok(c, _request(prompt, 3, text=True, max_tokens=24))
    text = full.text
    assert len(text) > 8, full
    stop = text[len(text) // 2:len(text) // 2 + 3]
    if not stop.strip():
        pytest.skip("no usable stop string in %r" % text)
    r = u.generate_ok(c, dict(_request(prompt, 3, text=True, max_tokens=24),
                              stopping={"max_tokens": 24, "ignore_eos": True,
                                        "stop": [stop]}))
    assert u.finish_name(r) == "STOP", r
    assert stop not in r.text
    assert 0 < len(r.ids) < len(full.ids)
    _assert_aligned(r, 5)
    assert r.ids == full.ids[:len(r.ids)]
    assert [_key(x) for x in r.logprobs] == \
        [_key(x) for x in full.logprobs[:len(r.ids)]]


def test_prompt_logprobs_fresh_and_second_turn(cluster):
    """Fresh: tokens 1.. of the prompt. A session's second turn: every
    prompt token, the first scored by the first turn's last row. Both equal
    a one-shot request's prompt logprobs over the whole history at the same
    offsets, as do the first turn's generated tokens' logprobs."""
    c = cluster.client
    p1, p2 = PROMPTS[0], PROMPTS[1][:7]
    n = 3
    one = u.generate_ok(c, _request(p1, 0, prompt_logprobs=n))
    assert [lp.id for lp in one.final.prompt_logprobs] == p1[1:]
    for lp in one.final.prompt_logprobs:
        assert len(lp.top_ids) == n

    sid = c.call("specserve.v1.Sessions/OpenSession",
                 capacity=512).session_id
    t1 = u.generate_ok(c, dict(_request(p1, 2, max_tokens=8, prompt_logprobs=n),
                               session={"session_id": sid}))
    assert [lp.id for lp in t1.final.prompt_logprobs] == p1[1:]
    assert [_key(x) for x in t1.final.prompt_logprobs] == \
        [_key(x) for x in one.final.prompt_logprobs]
    t2 = u.generate_ok(c, dict(_request(p2, 2, max_tokens=4, prompt_logprobs=n),
                               session={"session_id": sid}))
    assert [lp.id for lp in t2.final.prompt_logprobs] == p2
    assert t2.final.usage.prompt_tokens == len(p2)

    # The session's history: p1, every token turn 1 committed (what it
    # showed, overshoot included: ignore_eos), then p2.
    history = p1 + list(t1.ids) + p2
    info = c.call("specserve.v1.Sessions/GetSession", session_id=sid)
    assert info.committed_tokens >= len(history)
    whole = u.generate_ok(c, _request(history, 0, max_tokens=1,
                                      prompt_logprobs=n))
    ref = [_key(x) for x in whole.final.prompt_logprobs]
    assert len(ref) == len(history) - 1
    # Entry i scores history[i + 1]. Turn 1 asked for 5 alternatives per
    # generated token and 3 per prompt token: compare ids and values.
    t1_keys = [(lp.id, _bits(lp.logprob)) for lp in t1.logprobs]
    ref_keys = [(lp.id, _bits(lp.logprob))
                for lp in whole.final.prompt_logprobs]
    assert t1_keys == ref_keys[len(p1) - 1:len(p1) - 1 + len(t1.ids)]
    start = len(p1) + len(t1.ids) - 1
    assert [_key(x) for x in t2.final.prompt_logprobs] == \
        ref[start:start + len(p2)]
    c.call("specserve.v1.Sessions/CloseSession", session_id=sid)


@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
def test_more_than_20_is_invalid_argument(cluster, field):
    req = _request(PROMPTS[0], 0, logprobs=None)
    req["response"][field] = 21
    r = u.generate(cluster.client, req)
    assert r.code == grpc.StatusCode.INVALID_ARGUMENT, r
    assert "response." + field in r.details, r.details
