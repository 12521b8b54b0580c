"""A1 and the public API surface, with a reflection-only client (no .proto):
every RPC of specserve.v1 is listed, described and called; text streams;
a 3-turn session reports its cached prefix and regenerates with REWIND;
Sessions Open/Get/List/Close; Abort by request id and by session id;
Tokenize/Detokenize round trips. Workers measure their own step costs here
(the default configuration)."""
import os
import signal
import subprocess
import sys

import grpc
import pytest

import e2e_util as u
import specserve_procs as procs

EXPECTED_RPCS = {
    "specserve.v1.Generation": {"Generate"},
    "specserve.v1.Sessions": {"OpenSession", "GetSession", "ListSessions",
                              "CloseSession"},
    "specserve.v1.Tokenization": {"Tokenize", "Detokenize"},
    "specserve.v1.Admin": {"GetServerInfo", "GetModelInfo", "LoadModel",
                           "Abort", "Drain"},
}
RPC_TOOL = os.path.join(procs.REPO, "tools", "rpc", "rpc")


@pytest.fixture(scope="module")
def cluster():
    c = u.Cluster(n_workers=1, model=u.DEFAULT_MODEL)
    yield c
    c.stop()


def test_reflection_lists_and_describes_every_rpc(cluster):
    client = cluster.client
    services = set(client.services())
    for name, rpcs in EXPECTED_RPCS.items():
        assert name in services
        service = client.pool.FindServiceByName(name)
        assert {m.name for m in service.methods} == rpcs, name
        for m in service.methods:
            assert client.message_class(m.input_type)().DESCRIPTOR.full_name
            assert client.message_class(m.output_type)().DESCRIPTOR.full_name
            assert m.server_streaming == (m.name == "Generate")


def test_rpc_tool_lists_describes_and_streams_text(cluster):
    """tools/rpc/rpc (reflection only) as a user would run it."""
    addr = cluster.scheduler.address
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, RPC_TOOL, addr] + list(a), capture_output=True,
        text=True, timeout=60)
    listed = run("list")
    assert listed.returncode == 0, listed.stderr
    for name in EXPECTED_RPCS:
        assert name in listed.stdout.split()
    described = run("describe", "specserve.v1.Generation")
    assert "rpc Generate(specserve.v1.GenerateRequest) returns (stream " \
        "specserve.v1.GenerateEvent)" in described.stdout
    called = run("call", "specserve.v1.Generation/Generate",
                 '{"text": "def f(x):\\n", "stopping": {"maxTokens": 12}, '
                 '"speculation": {"enable": true, "k": 3}, '
                 '"response": {"specStats": true}}')
    assert called.returncode == 0, called.stderr
    assert '"text"' in called.stdout and '"finishReason"' in called.stdout


def test_every_rpc_answers(cluster):
    c = cluster.client
    info = c.call("specserve.v1.Admin/GetServerInfo")
    assert info.version and not info.draining and info.model.vocab_size
    assert c.call("specserve.v1.Admin/GetModelInfo").vocab_size == \
        info.model.vocab_size
    # A real switch is test_load_model.py's (it restarts the workers).
    code, details = u.rpc_code(c.call, "specserve.v1.Admin/LoadModel",
                               model_dir="/nonexistent")
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "/nonexistent" in \
        details
    code, details = u.rpc_code(c.call, "specserve.v1.Admin/Abort",
                               request_id="nope")
    assert code == grpc.StatusCode.NOT_FOUND and "nope" in details
    code, _ = u.rpc_code(c.call, "specserve.v1.Admin/Abort")
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    ids = c.call("specserve.v1.Tokenization/Tokenize", text="hello").ids
    assert c.call("specserve.v1.Tokenization/Detokenize",
                  ids=ids).text == "hello"
    s = c.call("specserve.v1.Sessions/OpenSession")
    assert s.session_id in [x.session_id for x in c.call(
        "specserve.v1.Sessions/ListSessions").sessions]
    assert c.call("specserve.v1.Sessions/GetSession",
                  session_id=s.session_id).session_id == s.session_id
    c.call("specserve.v1.Sessions/CloseSession", session_id=s.session_id)
    r = u.generate_ok(c, {"text": "x = ", "stopping": {"max_tokens": 3}})
    assert r.final.finish_reason
    # Drain, last: on a second scheduler over the same worker.
    extra = cluster.add_scheduler([cluster.workers[0].address])
    ec = cluster.client_for(extra)
    assert ec.call("specserve.v1.Admin/Drain").in_flight == 0
    u.wait_until(lambda: ec.health("") == "NOT_SERVING",
                 what="health NOT_SERVING")
    # Drained, still up (until SIGTERM), refusing new work.
    u.wait_until(lambda: "drained: refusing new work until SIGTERM"
                 in extra.text(), what="drain over")
    assert extra.popen.poll() is None, extra.text()
    r = u.generate(ec, {"text": "x = ", "stopping": {"max_tokens": 3}})
    assert r.code == grpc.StatusCode.UNAVAILABLE and "draining" in \
        r.details, r
    extra.signal(signal.SIGTERM)
    assert extra.wait(15) == 0, extra.text()


def test_text_input_streams_text(cluster):
    c = cluster.client
    text = "def merge_sorted(left, right):\n    result = []\n"
    prompt = list(c.call("specserve.v1.Tokenization/Tokenize", text=text).ids)
    r = u.generate_ok(c, {"text": text, "stopping": {"max_tokens": 24},
                          "speculation": {"enable": True, "k": 3},
                          "response": {"ids": True, "spec_stats": True}})
    assert r.deltas >= 2, "text was not streamed: %r" % r
    assert r.text, r
    assert r.text == c.call("specserve.v1.Tokenization/Detokenize",
                            ids=r.ids, skip_special=True).text
    assert r.final.usage.prompt_tokens == len(prompt)
    assert r.final.usage.completion_tokens == len(r.ids)
    assert r.final.request_id and r.final.seed
    assert r.final.session_id == ""  # one-shot: no session kept
    u.assert_matches_reference(prompt, r, 24, what="text prompt")
    # Text only unless ids are asked for.
    r2 = u.generate_ok(c, {"text": text, "stopping": {"max_tokens": 8}})
    assert r2.text and not r2.ids


def _turn(c, sid, text, mode="APPEND", max_tokens=12):
    return u.generate_ok(c, {
        "text": text, "session": {"session_id": sid, "mode": mode},
        "stopping": {"max_tokens": max_tokens, "ignore_eos": True},
        "speculation": {"enable": True, "k": 3},
        "response": {"ids": True, "spec_stats": True}})


def test_three_turn_session_cached_prefix_and_rewind(cluster):
    c = cluster.client
    sid = c.call("specserve.v1.Sessions/OpenSession").session_id
    get = lambda: c.call("specserve.v1.Sessions/GetSession",  # noqa: E731
                         session_id=sid)
    tok = lambda t: list(c.call(  # noqa: E731
        "specserve.v1.Tokenization/Tokenize", text=t, parse_special=True).ids)
    turns = ["import os\n\n", "class Config:\n", "    def __init__(self):\n"]
    history = []
    results = []
    for i, text in enumerate(turns):
        committed_before = get().committed_tokens
        r = _turn(c, sid, text)
        results.append(r)
        assert r.final.session_id == sid
        assert r.text
        if i == 0:
            assert r.final.usage.cached_prompt_tokens == 0
        else:
            # The whole earlier conversation came from the session's caches.
            assert r.final.usage.cached_prompt_tokens == committed_before > 0
        history += tok(text)
        rewind_pos = len(history)
        history += list(r.ids)
        info = get()
        assert u.enum_name(info, "residency") == "PARKED"
        assert info.committed_tokens == len(history)
        assert info.rewind_pos == rewind_pos
        assert info.worker == cluster.workers[0].address
    # REWIND with no input = "regenerate" the last reply: it restarts from
    # the turn-3 prompt checkpoint (cached) and, greedy, says the same.
    again = u.generate_ok(c, {
        "session": {"session_id": sid, "mode": "REWIND"},
        "stopping": {"max_tokens": 12, "ignore_eos": True},
        "speculation": {"enable": True, "k": 3}, "response": {"ids": True}})
    assert again.ids == results[-1].ids
    assert again.final.usage.cached_prompt_tokens == rewind_pos
    assert get().committed_tokens == rewind_pos + len(again.ids)
    # REWIND with input = "edit the reply": the new text follows the prompt.
    edited = _turn(c, sid, "        pass\n", mode="REWIND", max_tokens=6)
    assert edited.final.usage.cached_prompt_tokens == rewind_pos
    edit_ids = tok("        pass\n")
    assert get().rewind_pos == rewind_pos + len(edit_ids)
    one_shot = history[:rewind_pos] + edit_ids
    u.assert_matches_reference(one_shot, edited, 6, ignore_eos=True,
                               what="edited reply")
    c.call("specserve.v1.Sessions/CloseSession", session_id=sid)


def test_session_info_fields_and_lifecycle(cluster):
    c = cluster.client
    base = u.wait_worker_idle(cluster, 0, sessions=0)
    s = c.call("specserve.v1.Sessions/OpenSession", capacity=256)
    sid = s.session_id
    assert sid.startswith("ses_") and len(sid) == 36
    assert u.enum_name(s, "residency") == "NEW"
    assert s.capacity == 256 and not s.HasField("rewind_pos")
    assert s.committed_tokens == 0 and not s.busy
    prompt = u.prompt_ids(7)
    r = u.generate_ok(c, {"token_ids": {"ids": prompt},
                          "session": {"session_id": sid},
                          "stopping": {"max_tokens": 16, "ignore_eos": True},
                          "speculation": {"enable": True, "k": 2},
                          "response": {"spec_stats": True}})
    u.assert_matches_reference(prompt, r, 16, ignore_eos=True)
    info = c.call("specserve.v1.Sessions/GetSession", session_id=sid)
    assert u.enum_name(info, "residency") == "PARKED"
    assert u.enum_name(info, "mode") == "SPECULATIVE"
    assert info.worker == cluster.workers[0].address
    assert info.committed_tokens == len(prompt) + len(r.ids)
    assert info.capacity == 256 and info.rewind_pos == len(prompt)
    assert not info.busy
    t = info.telemetry
    assert t.rounds == r.final.spec_stats.rounds > 0
    assert t.drafted == 2 * t.rounds and 0 <= t.accepted <= t.drafted
    assert list(t.drafted_per_position) == [t.rounds, t.rounds]
    assert sum(t.accepted_per_position) == t.accepted
    g = info.last_gate_decision
    assert u.enum_name(g, "mode") == "SPECULATIVE" and g.reason
    listed = c.call("specserve.v1.Sessions/ListSessions").sessions
    assert sid in [x.session_id for x in listed]
    parked = u.wait_worker_idle(cluster, 0, sessions=1)
    assert parked.memory_used_bytes > base.memory_used_bytes
    c.call("specserve.v1.Sessions/CloseSession", session_id=sid)
    code, _ = u.rpc_code(c.call, "specserve.v1.Sessions/GetSession",
                         session_id=sid)
    assert code == grpc.StatusCode.NOT_FOUND
    assert sid not in [x.session_id for x in c.call(
        "specserve.v1.Sessions/ListSessions").sessions]
    # The worker freed the caches: back to the idle baseline.
    idle = u.wait_worker_idle(cluster, 0, sessions=0)
    assert idle.memory_used_bytes == base.memory_used_bytes


LONG = {"stopping": {"max_tokens": 3000, "ignore_eos": True},
        "speculation": {"enable": False}}


def test_abort_by_request_id(cluster):
    c = cluster.client
    req = dict(LONG, token_ids={"ids": u.prompt_ids(11)},
               request_id="abort-me-by-id")
    st = u.Stream(c, req)
    st.wait_tokens(1)
    assert c.call("specserve.v1.Admin/Abort",
                  request_id="abort-me-by-id").aborted == 1
    r = st.join()
    assert (r.ok and u.finish_name(r) == "CANCELLED") or \
        r.code == grpc.StatusCode.CANCELLED, r
    assert len(r.ids) < 3000
    u.wait_worker_idle(cluster, 0, sessions=0)


def test_abort_by_session_id_keeps_session_usable(cluster):
    c = cluster.client
    sid = c.call("specserve.v1.Sessions/OpenSession", capacity=4096).session_id
    prompt = u.prompt_ids(12)
    st = u.Stream(c, dict(LONG, token_ids={"ids": prompt},
                          session={"session_id": sid}))
    st.wait_tokens(1)
    assert c.call("specserve.v1.Admin/Abort", session_id=sid).aborted == 1
    r = st.join()
    assert (r.ok and u.finish_name(r) == "CANCELLED") or \
        r.code == grpc.StatusCode.CANCELLED, r
    # The session keeps what was generated and continues exactly.
    info = u.wait_until(lambda: (lambda i: not i.busy and i)(c.call(
        "specserve.v1.Sessions/GetSession", session_id=sid)), what="idle")
    n = info.committed_tokens - len(prompt)
    assert n >= len(r.ids)
    ref = u.specgen(prompt, n + 8, ignore_eos=True)
    nxt = u.generate_ok(c, {"session": {"session_id": sid},
                            "stopping": {"max_tokens": 8, "ignore_eos": True},
                            "response": {"ids": True}})
    assert nxt.ids == ref[n:n + len(nxt.ids)]
    c.call("specserve.v1.Sessions/CloseSession", session_id=sid)


def test_close_session_while_its_turn_runs(cluster):
    c = cluster.client
    sid = c.call("specserve.v1.Sessions/OpenSession", capacity=4096).session_id
    st = u.Stream(c, dict(LONG, token_ids={"ids": u.prompt_ids(13)},
                          session={"session_id": sid}))
    st.wait_tokens(1)
    c.call("specserve.v1.Sessions/CloseSession", session_id=sid)
    r = st.join()
    assert (r.ok and u.finish_name(r) == "CANCELLED") or \
        r.code == grpc.StatusCode.CANCELLED, r
    code, _ = u.rpc_code(c.call, "specserve.v1.Sessions/GetSession",
                         session_id=sid)
    assert code == grpc.StatusCode.NOT_FOUND
    # Its caches are freed, not parked where nothing would release them.
    u.wait_worker_idle(cluster, 0, sessions=0)


@pytest.mark.parametrize("text", [
    "hello world",
    "def f(x):\n    return x + 1\n",
    "naïve café — 日本語 🙂",
    "<|im_start|>user\nhi<|im_end|>\n",
    "  leading and trailing spaces  \n\n",
])
def test_tokenize_detokenize_round_trip(cluster, text):
    c = cluster.client
    ids = list(c.call("specserve.v1.Tokenization/Tokenize", text=text,
                      parse_special=True).ids)
    assert ids
    assert c.call("specserve.v1.Tokenization/Detokenize", ids=ids).text == text


def test_session_capacity_below_one_round_is_refused(cluster):
    """A session capacity below one prompt token plus one round at the
    largest k (10) is INVALID_ARGUMENT, from OpenSession and from a
    Generate that opens the session; 10 is accepted, and 0 still means the
    server's default."""
    c = cluster.client
    for capacity in (1, 9):
        code, details = u.rpc_code(c.call, "specserve.v1.Sessions/OpenSession",
                                   capacity=capacity)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, capacity
        assert "below the minimum of 10" in details, details
        r = u.generate(c, {"text": "a", "session": {"capacity": capacity},
                           "stopping": {"max_tokens": 1}})
        assert r.code == grpc.StatusCode.INVALID_ARGUMENT, r
        assert "session.capacity" in r.details
    opened = [c.call("specserve.v1.Sessions/OpenSession", capacity=10),
              c.call("specserve.v1.Sessions/OpenSession")]
    assert opened[0].capacity == 10
    assert opened[1].capacity > 10
    for s in opened:
        c.call("specserve.v1.Sessions/CloseSession", session_id=s.session_id)


def test_response_options_leave_out_text_and_ids(cluster):
    """response.text false leaves the text out of a text prompt's events
    (ids too unless response.ids), and stop strings still apply to the text
    that is not sent; for token ids in, text is off by default and stop
    strings apply likewise."""
    c = cluster.client
    req = {"text": "def add(a, b):\n", "stopping": {"max_tokens": 24,
                                                    "ignore_eos": True}}
    full = u.generate_ok(c, dict(req, response={"ids": True}))
    assert full.text and len(full.ids) == 24
    quiet = u.generate_ok(c, dict(req, response={"text": False}))
    assert quiet.text == "" and quiet.ids == [] and quiet.deltas == 0
    assert quiet.final.usage.completion_tokens == 24
    ids_only = u.generate_ok(c, dict(req, response={"text": False,
                                                    "ids": True}))
    assert ids_only.text == "" and ids_only.ids == full.ids
    stop = full.text[len(full.text) // 2:][:3]
    assert stop.strip(), full.text
    cut = u.generate_ok(c, {"text": "def add(a, b):\n",
                            "stopping": {"max_tokens": 24, "ignore_eos": True,
                                         "stop": [stop]},
                            "response": {"text": False, "ids": True}})
    assert u.finish_name(cut) == "STOP", cut
    assert 0 < len(cut.ids) < len(full.ids)
    assert cut.ids == full.ids[:len(cut.ids)]
    prompt = list(c.call("specserve.v1.Tokenization/Tokenize",
                         text=req["text"], parse_special=True).ids)
    by_ids = u.generate_ok(c, {"token_ids": {"ids": prompt},
                               "stopping": {"max_tokens": 24,
                                            "ignore_eos": True,
                                            "stop": [stop]}})
    assert by_ids.text == "" and by_ids.ids == cut.ids
