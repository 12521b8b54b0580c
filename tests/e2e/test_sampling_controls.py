"""Issue 48: vLLM's sampling controls through specserve.v1 Generate, with
speculation off and on: presence / frequency / repetition penalties and
logit_bias change the output and keep speculative == plain (greedy token for
token, sampled for one seed) across short bursts and session turns;
min_tokens holds EOS and stop_token_ids back; a token biased by -100 never
appears; stop_token_ids stop the output and the final event's matched_stop
names what stopped it; bad controls are INVALID_ARGUMENT naming the field
and the session still works after.

One worker (speculation always pays) and a scheduler with 5-token bursts, so
a request's controls span many bursts (each burst carries the output so far:
BurstRequest.prior_output_tokens)."""
import collections

import grpc
import pytest

import e2e_util as u

PROMPTS = [u.prompt_ids(seed, n) for seed, n in ((11, 6), (12, 14))]
PENALTIES = [
    {"frequency_penalty": 1.5, "presence_penalty": 0.5},
    {"repetition_penalty": 1.8},
    {"presence_penalty": -2.0, "repetition_penalty": 0.8},
]
SAMPLED = {"temperature": 0.9, "top_p": 0.95, "seed": 4321}


@pytest.fixture(scope="module")
def cluster():
    c = u.Cluster(n_workers=1, worker_extra=[u.SPEC_ALWAYS_PAYS],
                  scheduler_extra=["--burst_tokens=5"])
    yield c
    c.stop()


def request(prompt, k, max_tokens=24, sampling=None, stopping=None,
            **extra):
    req = {"token_ids": {"ids": prompt},
           "sampling": dict(sampling or {}),
           "stopping": dict({"max_tokens": max_tokens, "ignore_eos": True},
                            **(stopping or {})),
           "speculation": {"enable": k > 0, "k": k},
           "response": {"spec_stats": True}}
    req.update(extra)
    return req


def run(c, prompt, k, **kw):
    r = u.generate_ok(c, request(prompt, k, **kw))
    assert (r.final.spec_stats.rounds > 0) == (k > 0), r
    return r


@pytest.mark.parametrize("controls", PENALTIES)
def test_penalties_change_greedy_output_and_speculation_does_not(cluster,
                                                                 controls):
    c = cluster.client
    changed = False
    for prompt in PROMPTS:
        plain = run(c, prompt, 0, sampling=controls)
        assert len(plain.ids) == 24
        without = run(c, prompt, 0)
        changed = changed or plain.ids != without.ids
        for k in (1, 2, 4):
            spec = run(c, prompt, k, sampling=controls)
            assert spec.ids == plain.ids, (controls, k, prompt[:3])
    assert changed, "the penalties changed no output: %r" % controls


@pytest.mark.parametrize("controls", PENALTIES)
def test_sampled_with_penalties_same_tokens_with_and_without_speculation(
        cluster, controls):
    c = cluster.client
    sampling = dict(SAMPLED, **controls)
    plain = run(c, PROMPTS[1], 0, sampling=sampling)
    assert plain.final.seed == SAMPLED["seed"]
    for k in (2, 3):
        assert run(c, PROMPTS[1], k, sampling=sampling).ids == plain.ids, k


def test_session_turn_with_penalties_equals_one_shot_over_history(cluster):
    """The penalties of turn 2 count turn 2's output; its prompt is the whole
    history, as for a one-shot request that sends it again."""
    c = cluster.client
    controls = PENALTIES[0]
    sid = c.call("specserve.v1.Sessions/OpenSession",
                 capacity=256).session_id
    history = []
    for prompt in PROMPTS:
        turn = run(c, prompt, 3, sampling=controls, max_tokens=12,
                   session={"session_id": sid})
        one_shot = run(c, history + prompt, 0, sampling=controls,
                       max_tokens=12)
        assert turn.ids[:12] == one_shot.ids
        history += prompt + list(turn.ids)
    c.call("specserve.v1.Sessions/CloseSession", session_id=sid)


def test_banned_token_never_appears(cluster):
    c = cluster.client
    prompt = PROMPTS[0]
    for sampling in ({}, SAMPLED):
        free = run(c, prompt, 3, sampling=sampling, max_tokens=40)
        banned = collections.Counter(free.ids).most_common(1)[0][0]
        biased = dict(sampling, logit_bias={str(banned): -100})
        outs = [run(c, prompt, k, sampling=biased, max_tokens=40).ids
                for k in (0, 3)]
        assert outs[0] == outs[1]
        assert banned not in outs[0], (banned, outs[0])


def test_min_tokens_holds_eos_back(cluster):
    """EOS biased by +100 would come first; min_tokens holds it back exactly
    that many tokens, then it ends the output (finish STOP, named)."""
    c = cluster.client
    eos = sorted(u.eos_ids())[0]
    bias = {"logit_bias": {str(eos): 100}}
    stop = {"ignore_eos": False}
    r = run(c, PROMPTS[0], 0, sampling=bias, stopping=stop)
    assert r.ids == [] and u.finish_name(r) == "STOP"
    assert r.final.matched_token_id == eos
    outs = []
    for k in (0, 2, 4):
        r = run(c, PROMPTS[0], k, sampling=bias,
                stopping=dict(stop, min_tokens=7))
        assert len(r.ids) == 7 and eos not in r.ids, r.ids
        assert u.finish_name(r) == "STOP"
        assert r.final.WhichOneof("matched_stop") == "matched_token_id"
        assert r.final.matched_token_id == eos
        outs.append(r.ids)
    assert outs[0] == outs[1] == outs[2]


def test_stop_token_ids_stop_and_matched_stop_names_them(cluster):
    c = cluster.client
    prompt = PROMPTS[1]
    free = run(c, prompt, 0, max_tokens=20).ids
    stop_at = next(i for i in range(3, 20) if free[i] not in free[:i])
    stop_id = free[stop_at]
    for k in (0, 3):
        r = run(c, prompt, k, max_tokens=20,
                stopping={"stop_token_ids": [stop_id]})
        assert r.ids == free[:stop_at]
        assert u.finish_name(r) == "STOP"
        assert r.final.matched_token_id == stop_id
        # Shown as the last id when asked (vLLM's output ids).
        shown = run(c, prompt, k, max_tokens=20,
                    stopping={"stop_token_ids": [stop_id]},
                    response={"spec_stats": True,
                              "include_stop_token": True})
        assert shown.ids == free[:stop_at + 1]
        assert shown.final.usage.completion_tokens == stop_at + 1
        # min_tokens past it: the stop token id waits.
        later = run(c, prompt, k, max_tokens=20,
                    stopping={"stop_token_ids": [stop_id],
                              "min_tokens": stop_at + 1})
        assert len(later.ids) > stop_at
        assert later.ids[stop_at] != stop_id
    # Without a stop: no matched_stop.
    r = run(c, prompt, 0, max_tokens=5)
    assert r.final.WhichOneof("matched_stop") is None


def test_stop_string_is_matched_stop(cluster):
    c = cluster.client
    r = u.generate_ok(c, {"text": "def add(a, b):\n",
                          "sampling": {"temperature": 0},
                          "stopping": {"max_tokens": 40, "stop": ["\n"]}})
    assert u.finish_name(r) == "STOP", r
    assert r.final.matched_stop_str == "\n"


BAD = [
    ({"sampling": {"logit_bias": {"999999": 1.0}}}, "sampling.logit_bias"),
    ({"sampling": {"logit_bias": {"5": 150.0}}}, "sampling.logit_bias"),
    ({"sampling": {"presence_penalty": 2.5}}, "sampling.presence_penalty"),
    ({"sampling": {"frequency_penalty": -3}}, "sampling.frequency_penalty"),
    ({"sampling": {"repetition_penalty": -1}}, "sampling.repetition_penalty"),
    ({"stopping": {"max_tokens": 4, "min_tokens": 5}}, "stopping.min_tokens"),
]


@pytest.mark.parametrize("bad,field", BAD)
def test_bad_controls_refused_and_the_session_still_works(cluster, bad, field):
    c = cluster.client
    sid = c.call("specserve.v1.Sessions/OpenSession",
                 capacity=256).session_id
    first = run(c, PROMPTS[0], 2, max_tokens=6, session={"session_id": sid})
    req = request(PROMPTS[1], 2, max_tokens=6, session={"session_id": sid})
    for part, fields in bad.items():
        req[part].update(fields)
    r = u.generate(c, req)
    assert r.code == grpc.StatusCode.INVALID_ARGUMENT, r
    assert field in r.details, r.details
    history = PROMPTS[0] + list(first.ids)
    good = run(c, PROMPTS[1], 2, max_tokens=6, session={"session_id": sid},
               sampling=PENALTIES[1])
    want = run(c, history + PROMPTS[1], 0, max_tokens=6,
               sampling=PENALTIES[1])
    assert good.ids[:6] == want.ids
    c.call("specserve.v1.Sessions/CloseSession", session_id=sid)
