"""Automatic prefix reuse (docs/DESIGN.md "Prefix reuse", issue 32): a
request whose prompt starts with a history a parked session holds at its
prompt checkpoint or committed end resumes from that state and prefills only
the rest.

- Property test: a seeded random sequence of one-shot requests and new
  sessions' turns (greedy, with and without speculation) whose prompts share
  prefixes: repeats, extensions of an earlier generation, divergences inside
  an earlier prompt or reply. Every output equals specgen's from-scratch
  continuation, and cached_prompt_tokens equals the position the test
  predicts from the histories it has seen (the longest recorded checkpoint
  the prompt starts with whose source holds the draft state it needs).
- Prefix checkpoints: prompts that share only a beginning (a system prompt
  with other questions) resume from the states the worker saved inside an
  earlier prompt (--prefix_checkpoint_interval), exactly; an offloaded
  source's are gone and cost a prefill, not an error.
- Memory pressure: budgets that hold a few checkpoints, 40 distinct
  prompts cycled: no request fails, evicted ones are prefilled again
  (cached 0) and still exact, the most recent one still hits.
- Tenancy: the same prompt from two tenants never hits across them, and
  the cache's sessions show in no tenant's ListSessions.
"""
import random

import pytest

import e2e_util as u

OPEN = "specserve.v1.Sessions/OpenSession"
LIST = "specserve.v1.Sessions/ListSessions"
PREFIX_ON = ["--prefix_cache_sessions=64"]


def _req(ids, n, spec, sid=None):
    req = {"token_ids": {"ids": list(ids)},
           "stopping": {"max_tokens": n, "ignore_eos": True},
           "speculation": {"enable": spec, "k": 3},
           "response": {"ids": True}}
    if sid is not None:
        req["session"] = {"session_id": sid}
    return req


class Histories:
    """What the scheduler's prefix tree should hold: per source (a one-shot
    request or a session), its reusable positions' token prefixes and
    whether it holds draft state."""

    def __init__(self, has_mtp):
        self.has_mtp = has_mtp
        self.sources = {}  # key -> (list of token tuples, draft)

    def needs_draft(self, spec, session):
        # Draft state only for turns that ask for speculation (a session's
        # later turn that does is promoted: rebuilt, not resumed).
        return self.has_mtp and spec

    def predict(self, prompt, need_draft):
        best = 0
        for prefixes, draft in self.sources.values():
            if need_draft and not draft:
                continue
            for p in prefixes:
                if len(p) <= len(prompt) and tuple(prompt[:len(p)]) == p:
                    best = max(best, len(p))
        return best

    def record(self, key, prompt_end, history, draft):
        self.sources[key] = ([tuple(history[:prompt_end]), tuple(history)],
                             draft)


@pytest.fixture(scope="module")
def cluster():
    c = u.Cluster(worker_extra=[u.SPEC_ALWAYS_PAYS],
                  scheduler_extra=PREFIX_ON + ["--burst_tokens=8"],
                  metrics=True)
    yield c
    c.stop()


def test_random_sequences_resume_exactly_from_the_predicted_position(cluster):
    c = cluster.client
    has_mtp = cluster.worker_info(0).model.has_mtp
    rng = random.Random(3207)
    known = Histories(has_mtp)
    histories = []  # (prompt, full history) of every request so far
    hits = 0
    opened = set()
    for step in range(28):
        kind = rng.choice(["fresh", "repeat", "extend", "diverge_reply",
                           "diverge_prompt", "extend", "repeat"])
        if not histories or kind == "fresh":
            prompt = u.prompt_ids(1000 + step, rng.randrange(4, 20))
        else:
            p, h = rng.choice(histories)
            tail = u.prompt_ids(2000 + step, rng.randrange(1, 6))
            if kind == "repeat":
                prompt = list(p)  # the prompt checkpoint, exactly
            elif kind == "extend":
                prompt = h + tail  # the committed end and more
            elif kind == "diverge_reply":
                cut = rng.randrange(len(p), len(h) + 1)
                prompt = h[:cut] + tail
            else:
                prompt = p[:rng.randrange(1, len(p) + 1)] + tail
        spec = rng.random() < 0.5
        as_session = rng.random() < 0.35
        n = rng.randrange(3, 14)
        need = known.needs_draft(spec, as_session)
        want_cached = known.predict(prompt, need)
        sid = c.call(OPEN, capacity=512).session_id if as_session else None
        if sid:
            opened.add(sid)
        r = u.generate_ok(c, _req(prompt, n, spec, sid))
        what = "step %d (%s, spec=%s, session=%s)" % (step, kind, spec,
                                                       as_session)
        u.assert_matches_reference(prompt, r, n, ignore_eos=True, what=what)
        assert r.final.usage.cached_prompt_tokens == want_cached, (what, r)
        assert r.final.usage.prompt_tokens == len(prompt), (what, r)
        hits += want_cached > 0
        history = prompt + list(r.ids)
        known.record(sid or ("one-shot", step), len(prompt), history, need)
        histories.append((prompt, history))
        if as_session and rng.random() < 0.5:
            # A second turn: the session's entries move to its new ends.
            more = u.prompt_ids(3000 + step, 3)
            r2 = u.generate_ok(c, _req(more, 4, spec, sid))
            u.assert_matches_reference(history + more, r2, 4,
                                       ignore_eos=True, what=what + " turn 2")
            assert r2.final.usage.cached_prompt_tokens == len(history), r2
            history = history + more + list(r2.ids)
            known.record(sid, len(history) - len(r2.ids), history, need)
            histories.append((prompt, history))
    assert hits >= 8, "too few hits to test reuse: %d" % hits
    assert u.metric(cluster.scheduler, "specserve_prefix_hits_total") >= hits
    # The cache's sessions belong to no tenant's list: only those opened.
    listed = {s.session_id for s in c.call(LIST).sessions}
    assert listed == opened, (listed, opened)


def test_cache_owned_sessions_are_hidden_and_prompt_logprobs_prefill(cluster):
    c = cluster.client
    before = {s.session_id for s in c.call(LIST).sessions}
    prompt = u.prompt_ids(4242, 9)
    u.generate_ok(c, _req(prompt, 5, False))
    assert {s.session_id for s in c.call(LIST).sessions} == before
    r = u.generate_ok(c, _req(prompt, 5, False))
    assert r.final.usage.cached_prompt_tokens == len(prompt), r
    # Prompt logprobs need every prompt row: nothing is reused.
    req = _req(prompt, 5, False)
    req["response"]["prompt_logprobs"] = 0
    r = u.generate_ok(c, req)
    assert r.final.usage.cached_prompt_tokens == 0, r
    u.assert_matches_reference(prompt, r, 5, ignore_eos=True)


def test_speculative_one_shot_reply_end_resumes_the_follow_up(cluster):
    """A speculative one-shot request commits nothing past max_tokens (its
    rounds draft no deeper than that leaves room for), so its kept session
    ends where its reply does: a follow-up that resends prompt and reply
    (a chat's next message) resumes there, exactly."""
    c = cluster.client
    max_tokens = 16
    for seed in range(4300, 4306):
        prompt = u.prompt_ids(seed, 7)
        req = _req(prompt, max_tokens, True)
        req["speculation"]["k"] = 4
        r = u.generate_ok(c, req)
        assert len(r.ids) == max_tokens, r
        assert r.final.usage.overshoot_tokens == 0, r
        follow = prompt + list(r.ids) + u.prompt_ids(seed + 100, 3)
        f = u.generate_ok(c, _req(follow, 4, True))
        assert f.final.usage.cached_prompt_tokens == len(prompt) + max_tokens, \
            (seed, f)
        u.assert_matches_reference(follow, f, 4, ignore_eos=True)


# ---------------------------------------------------------------------------
# Prefix checkpoints: states saved inside prompts as they are prefilled

EVERY = 64  # --prefix_checkpoint_interval of the fixture below
KEEP = 2    # --prefix_checkpoints


def inside(start, end):
    """The prefix checkpoints a worker saves prefilling rows [start, end):
    the KEEP highest multiples of EVERY strictly inside."""
    return [q for q in range(EVERY, end, EVERY) if q > start][-KEEP:]


@pytest.fixture(scope="module")
def checkpointing():
    c = u.Cluster(worker_extra=[u.SPEC_ALWAYS_PAYS,
                                "--prefix_checkpoint_interval=%d" % EVERY,
                                "--prefix_checkpoints=%d" % KEEP],
                  scheduler_extra=PREFIX_ON + ["--burst_tokens=8"])
    yield c
    c.stop()


def test_prompts_sharing_only_a_beginning_resume_inside_it(checkpointing):
    """A few "system prompts" of random lengths, each followed by other
    questions (one-shot requests and sessions' turns, with and without
    speculation): a request resumes from the highest saved position its
    prompt starts with, prompt checkpoints and committed ends as before and
    now also the states saved inside earlier prompts, and its tokens equal a
    from-scratch run."""
    c = checkpointing.client
    has_mtp = checkpointing.worker_info(0).model.has_mtp
    rng = random.Random(9411)
    systems = [u.prompt_ids(7000 + i, rng.randrange(70, 270))
               for i in range(3)]
    # source -> (positions as token tuples, draft state held)
    sources = {}
    inside_hits = 0
    for step in range(18):
        system = rng.choice(systems)
        prompt = system + u.prompt_ids(8000 + step, rng.randrange(1, 40))
        spec = rng.random() < 0.4
        need = has_mtp and spec
        want = 0
        for positions, draft in sources.values():
            if need and not draft:
                continue
            for p in positions:
                if len(p) <= len(prompt) and tuple(prompt[:len(p)]) == p:
                    want = max(want, len(p))
        sid = None
        if rng.random() < 0.3:
            sid = c.call(OPEN, capacity=512).session_id
        n = rng.randrange(2, 9)
        r = u.generate_ok(c, _req(prompt, n, spec, sid))
        what = "step %d (spec=%s, session=%s)" % (step, spec, sid is not None)
        u.assert_matches_reference(prompt, r, n, ignore_eos=True, what=what)
        assert r.final.usage.cached_prompt_tokens == want, (what, want, r)
        inside_hits += want > 0 and want % EVERY == 0 and want < len(prompt)
        history = prompt + list(r.ids)
        saved = inside(want, len(prompt))
        sources[sid or ("one-shot", step)] = (
            [tuple(history[:q]) for q in saved + [len(prompt)]] +
            [tuple(history)], need)
    assert inside_hits >= 4, "too few resumptions inside a prompt: %d" % (
        inside_hits)


def test_a_fork_inside_a_prompt_is_refused_once_the_source_is_offloaded():
    """The worker drops a session's prefix checkpoints when it offloads it:
    a later request sharing only the beginning is prefilled (cached 0),
    exactly, and the source's own positions still serve."""
    tight = u.Cluster(worker_extra=["--prefix_checkpoint_interval=%d" % EVERY,
                                    "--memory_budget_mb=0"],
                      scheduler_extra=PREFIX_ON)
    try:
        c = tight.client
        system = u.prompt_ids(7500, 150)
        first = system + u.prompt_ids(7501, 10)
        r = u.generate_ok(c, _req(first, 4, False))
        assert r.final.usage.cached_prompt_tokens == 0, r
        other = system + u.prompt_ids(7502, 10)
        r = u.generate_ok(c, _req(other, 4, False))
        u.assert_matches_reference(other, r, 4, ignore_eos=True)
        assert r.final.usage.cached_prompt_tokens == 0, r
        r = u.generate_ok(c, _req(first, 4, False))
        u.assert_matches_reference(first, r, 4, ignore_eos=True)
        assert r.final.usage.cached_prompt_tokens == len(first), r
    finally:
        tight.stop()


# ---------------------------------------------------------------------------
# Memory pressure


@pytest.fixture(scope="module")
def tight():
    # One finished one-shot request of 40+6 tokens holds about 0.95 MB: the
    # device budget fits one, the host budget three more; older ones are
    # offloaded, then dropped.
    c = u.Cluster(worker_extra=[u.SPEC_ALWAYS_PAYS, "--memory_budget_mb=1",
                                "--host_budget_mb=3"],
                  scheduler_extra=PREFIX_ON)
    yield c
    c.stop()


def test_forty_prefixes_cycle_through_a_budget_of_a_few(tight):
    c = tight.client
    prompts = [u.prompt_ids(5000 + i, 40) for i in range(40)]
    cached = []
    for cycle in range(2):
        for i, p in enumerate(prompts):
            r = u.generate_ok(c, _req(p, 6, False))
            u.assert_matches_reference(p, r, 6, ignore_eos=True,
                                       what="cycle %d prompt %d" % (cycle, i))
            assert r.final.usage.cached_prompt_tokens in (0, len(p)), r
            cached.append(r.final.usage.cached_prompt_tokens)
    # The first cycle has nothing to reuse; by the time a prompt comes
    # back, 39 others have pushed it out of the budgets.
    assert cached == [0] * 80, cached
    info = tight.worker_info(0)
    assert 0 < info.sessions < 40, info
    # The most recent checkpoint is still held.
    r = u.generate_ok(c, _req(prompts[-1], 6, False))
    assert r.final.usage.cached_prompt_tokens == len(prompts[-1]), r
    u.assert_matches_reference(prompts[-1], r, 6, ignore_eos=True)


# ---------------------------------------------------------------------------
# Tenancy


ALICE = "alice-token-4f1c2a9be07d"
BOB = "bob-token-93d1e6c0a5f2"


@pytest.fixture(scope="module")
def tenants(tmp_path_factory):
    path = tmp_path_factory.mktemp("auth") / "tokens.txt"
    path.write_text("%s alice user\n%s bob user\n" % (ALICE, BOB))
    c = u.Cluster(worker_extra=[u.SPEC_ALWAYS_PAYS],
                  scheduler_extra=PREFIX_ON + ["--auth_tokens=%s" % path],
                  scheduler_token=ALICE)
    c.alice = c.client_for(c.scheduler, token=ALICE)
    c.bob = c.client_for(c.scheduler, token=BOB)
    yield c
    c.stop()


def test_prefixes_never_match_across_tenants(tenants):
    prompt = u.prompt_ids(777, 16)
    for spec in (False, True):
        # Speculative requests need a source with draft state, which the
        # plain ones do not leave: the first of each kind misses.
        a1 = u.generate_ok(tenants.alice, _req(prompt, 6, spec))
        assert a1.final.usage.cached_prompt_tokens == 0, a1
        b = u.generate_ok(tenants.bob, _req(prompt, 6, spec))
        assert b.final.usage.cached_prompt_tokens == 0, b
        u.assert_matches_reference(prompt, b, 6, ignore_eos=True)
        a2 = u.generate_ok(tenants.alice, _req(prompt, 6, spec))
        assert a2.final.usage.cached_prompt_tokens == len(prompt), a2
        u.assert_matches_reference(prompt, a2, 6, ignore_eos=True)
    # Bob's own checkpoint seeds his new session's first turn; the cache's
    # sessions are in neither tenant's list.
    sid = tenants.bob.call(OPEN, capacity=256).session_id
    b = u.generate_ok(tenants.bob, _req(prompt, 4, True, sid))
    assert b.final.usage.cached_prompt_tokens == len(prompt), b
    assert [s.session_id for s in tenants.bob.call(LIST).sessions] == [sid]
    assert list(tenants.alice.call(LIST).sessions) == []
