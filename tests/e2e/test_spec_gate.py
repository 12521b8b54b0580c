"""A4: the spec gate (docs/DESIGN.md §4). With deterministic step costs from the
worker (--step_costs: a decode pass flat up to 8 rows, then growing with its
rows, as a GPU's turns compute-bound; a verify of k+1 columns ~1.05x a decode
step), one client's session runs speculative rounds (a round costs 1.05 steps
and yields ~1 + a·k tokens), while with 8 concurrent clients the sessions are
demoted to batched decode (their grouped rounds verify 32 rows, a pass of 4
steps' cost, for at most k+1 tokens each). Outputs are exact either way
(greedy == specgen), demotion is one-way, and a demoted session still
regenerates (REWIND) exactly from its cached prompt checkpoint. A session's
mode says what its caches can run and last_gate_decision what its latest
burst ran: turns that ask for no speculation keep no draft state, and a later
turn that asks for it promotes the session."""
import threading
import types

import pytest

import e2e_util as u

DECODE = ",".join("%.5f" % (0.0100 * max(1.0, b / 8)) for b in range(1, 17))
VERIFY = ",".join(["0.0105"] * 9)
COSTS = "--step_costs=decode=%s;verify=%s" % (DECODE, VERIFY)
CLIENTS = 8
MAX_TOKENS = 160


@pytest.fixture(scope="module")
def cluster():
    c = u.Cluster(n_workers=1, worker_extra=[COSTS],
                  scheduler_extra=["--burst_tokens=4"], metrics=True)
    yield c
    c.stop()


def _turn(sid, prompt, n=MAX_TOKENS, k=3, **extra):
    req = {"token_ids": {"ids": prompt}, "session": {"session_id": sid},
           "stopping": {"max_tokens": n, "ignore_eos": True},
           "speculation": {"enable": True, "k": k},
           "response": {"ids": True, "spec_stats": True}}
    req.update(extra)
    return req


def _open(c):
    return c.call("specserve.v1.Sessions/OpenSession").session_id


def _get(c, sid):
    return c.call("specserve.v1.Sessions/GetSession", session_id=sid)


def test_one_client_runs_speculative(cluster):
    c = cluster.client
    sid = _open(c)
    prompt = u.prompt_ids(71, 8)
    r = u.generate_ok(c, _turn(sid, prompt, n=40))
    u.assert_matches_reference(prompt, r, 40, ignore_eos=True)
    assert r.final.spec_stats.rounds > 0 and not r.final.spec_stats.demoted
    info = _get(c, sid)
    assert u.enum_name(info, "mode") == "SPECULATIVE"
    g = info.last_gate_decision
    assert u.enum_name(g, "mode") == "SPECULATIVE", g
    assert g.batch_size == 1
    assert g.verify_cost_ratio == pytest.approx(1.05, rel=1e-3)
    assert g.expected_tokens_per_round > g.verify_cost_ratio
    assert 0 < g.measured_acceptance <= 1 and "pays" in g.reason
    c.call("specserve.v1.Sessions/CloseSession", session_id=sid)


def test_many_clients_are_demoted_and_stay_exact(cluster):
    c = cluster.client
    batched_before = u.scrape(cluster.scheduler).get(
        'specserve_gate_decisions_total{decision="batched"}', 0)
    prompts = [u.prompt_ids(100 + i, 6 + i) for i in range(CLIENTS)]
    sids = [_open(c) for _ in range(CLIENTS)]
    results = [None] * CLIENTS
    start = threading.Barrier(CLIENTS)

    def run(i):
        start.wait(30)
        results[i] = u.generate(c, _turn(sids[i], prompts[i]))

    threads = [threading.Thread(target=run, args=(i,)) for i in
               range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive()
    for i, r in enumerate(results):
        assert r.ok, r
        # Exact whatever the gate decided, mid-request demotion included.
        u.assert_matches_reference(prompts[i], r, MAX_TOKENS,
                                   ignore_eos=True, what="client %d" % i)
    demoted = [i for i, r in enumerate(results)
               if r.final.spec_stats.demoted]
    infos = [_get(c, sid) for sid in sids]
    details = [(u.enum_name(x, "mode"), x.last_gate_decision.batch_size,
                x.last_gate_decision.reason) for x in infos]
    assert len(demoted) == CLIENTS, details
    for info in infos:
        g = info.last_gate_decision
        assert u.enum_name(info, "mode") == "BATCHED"
        assert u.enum_name(g, "mode") == "BATCHED"
        assert g.batch_size >= 4 and "demoted" in g.reason, g
        assert g.expected_tokens_per_round < g.verify_cost_ratio
    assert u.scrape(cluster.scheduler).get(
        'specserve_gate_decisions_total{decision="batched"}', 0) > \
        batched_before
    # Demotion is one-way: alone again, the session stays batched, exact.
    history = prompts[0] + list(results[0].ids)
    more = u.generate_ok(c, _turn(sids[0], [17, 18, 19], n=12))
    u.assert_matches_reference(history + [17, 18, 19], more, 12,
                               ignore_eos=True)
    assert more.final.spec_stats.rounds == 0
    assert u.enum_name(_get(c, sids[0]), "mode") == "BATCHED"
    # A demoted session (its draft state freed) keeps its prompt checkpoint:
    # it regenerates its last reply exactly, from its caches.
    regen = u.generate_ok(c, {"session": {"session_id": sids[0],
                                          "mode": "REWIND"},
                              "stopping": {"max_tokens": 12,
                                           "ignore_eos": True},
                              "response": {"ids": True}})
    assert regen.ids == more.ids
    assert regen.final.usage.cached_prompt_tokens == len(history) + 3
    assert u.enum_name(_get(c, sids[0]), "mode") == "BATCHED"
    info = _get(c, sids[0])
    assert info.committed_tokens == len(history) + 3 + len(regen.ids)
    # A new lone client speculates again.
    sid = _open(c)
    r = u.generate_ok(c, _turn(sid, prompts[1], n=24))
    assert r.final.spec_stats.rounds > 0 and not r.final.spec_stats.demoted
    assert u.enum_name(_get(c, sid), "mode") == "SPECULATIVE"
    for s in sids + [sid]:
        c.call("specserve.v1.Sessions/CloseSession", session_id=s)
    u.wait_worker_idle(cluster, 0, sessions=0)


def test_mode_is_what_the_caches_run_and_a_request_for_speculation_promotes(
        cluster):
    """SessionInfo.mode is what the session's caches can run,
    last_gate_decision what its latest burst ran. A session whose turns ask
    for no speculation holds no draft state (mode BATCHED, a fraction of the
    memory); a later request that asks for it promotes the session (its copy
    rebuilt with draft state), which then speculates, exactly."""
    c = cluster.client
    sid = _open(c)
    prompt = u.prompt_ids(93, 6)
    first = u.generate_ok(c, {"token_ids": {"ids": prompt},
                              "session": {"session_id": sid,
                                          "mode": "APPEND"},
                              "stopping": {"max_tokens": 8,
                                           "ignore_eos": True},
                              "speculation": {"enable": False},
                              "response": {"ids": True}})
    assert len(first.ids) == 8, first  # plain decode: no overshoot
    info = _get(c, sid)
    assert u.enum_name(info, "mode") == "BATCHED", info
    assert u.enum_name(info.last_gate_decision, "mode") == "BATCHED"
    assert info.last_gate_decision.reason == "speculation not requested"
    r = u.generate_ok(c, {"session": {"session_id": sid},
                          "stopping": {"max_tokens": 12, "ignore_eos": True},
                          "speculation": {"enable": True, "k": 2},
                          "response": {"spec_stats": True, "ids": True}})
    assert r.final.spec_stats.rounds > 0, r
    u.assert_matches_reference(
        prompt, types.SimpleNamespace(ids=list(first.ids) + list(r.ids)),
        len(first.ids) + 12, ignore_eos=True)
    info = _get(c, sid)
    assert u.enum_name(info, "mode") == "SPECULATIVE"
    assert u.enum_name(info.last_gate_decision, "mode") == "SPECULATIVE"
    c.call("specserve.v1.Sessions/CloseSession", session_id=sid)
