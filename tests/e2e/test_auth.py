"""Bearer tokens, tenants and the worker port (docs/RELIABILITY.md rows 11-13,
issue 30), with real processes: one CPU worker on the default model and a
scheduler with --auth_tokens naming a file this test writes (tenants alice
and bob with role user, ops with role admin).

  - every RPC but health needs a valid token (UNAUTHENTICATED saying what is
    missing), reflection included; health answers without one;
  - tenant bob cannot list, read, continue, rewind, close or abort alice's
    session or request (NOT_FOUND, as for an unknown id), and afterwards
    alice's session is unchanged: its next turn is specgen's continuation;
  - role user cannot Drain, LoadModel or Abort everything (PERMISSION_DENIED,
    the server keeps serving); admin can;
  - SIGHUP reloads the file: an added token works, a removed one is refused,
    a bad file keeps the tokens in force;
  - the worker port, called directly by someone without the scheduler's
    owner token: a made-up session runs as an isolated one; a Release or a
    Burst with a suffix on the scheduler's session fails NOT_FOUND and the
    session is unchanged (its next turn continues from the cache); one who
    has the owner token and changes the copy behind the scheduler's back is
    caught by the integrity guard, and the session is rebuilt exactly.
"""
import os
import signal
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_health.v1 import health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha import reflection_pb2_grpc

import e2e_util as u
import specserve_procs as procs

ALICE = "alice-token-4f1c2a9be07d"
BOB = "bob-token-93d1e6c0a5f2"
OPS = "ops-admin-token-1b7e55c3d9a0"
OLD = "old-token-will-be-revoked-01"
NEW = "new-token-added-on-sighup-02"
TOKENS = ("# test tokens: TOKEN TENANT ROLE\n\n"
          "%s alice user\n%s bob user\n%s ops admin\n%s carol user\n"
          % (ALICE, BOB, OPS, OLD))

GENERATE = "specserve.v1.Generation/Generate"
OPEN = "specserve.v1.Sessions/OpenSession"
GET = "specserve.v1.Sessions/GetSession"
LIST = "specserve.v1.Sessions/ListSessions"
CLOSE = "specserve.v1.Sessions/CloseSession"
TOKENIZE = "specserve.v1.Tokenization/Tokenize"
INFO = "specserve.v1.Admin/GetServerInfo"
ABORT = "specserve.v1.Admin/Abort"
DRAIN = "specserve.v1.Admin/Drain"
LOAD = "specserve.v1.Admin/LoadModel"
W_ADMIT = "specserve.worker.v1.Worker/Admit"
W_BURST = "specserve.worker.v1.Worker/Burst"
W_RELEASE = "specserve.worker.v1.Worker/Release"
W_STOP = "specserve.worker.v1.Worker/StopBurst"
W_STATE = "specserve.worker.v1.Worker/GetSessionState"
UNKNOWN_SESSION = "ses_" + "0" * 32


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("auth") / "tokens.txt"
    path.write_text(TOKENS)
    return str(path)


@pytest.fixture(scope="module")
def cluster(token_file):
    c = u.Cluster(n_workers=1, model=u.DEFAULT_MODEL,
                  worker_extra=[u.SPEC_ALWAYS_PAYS],
                  scheduler_extra=["--auth_tokens=" + token_file],
                  scheduler_token=OPS)
    c.alice = c.client_for(c.scheduler, token=ALICE)
    c.bob = c.client_for(c.scheduler, token=BOB)
    c.worker = c.worker_client(0)
    yield c
    c.stop()


def raw_call(cluster, method, fields=None, metadata=None, address=None):
    """Calls `method` on a plain channel with exactly `metadata` (message
    types from the admin client's reflection); returns (code, details)."""
    typed = cluster.client
    m = typed.method(method)
    request = u.make_request(typed, fields or {}) if method == GENERATE \
        else typed.request(method, **(fields or {}))
    response_cls = typed.message_class(m.output_type)
    channel = grpc.insecure_channel(address or cluster.scheduler.address)
    try:
        kind = channel.unary_stream if m.server_streaming \
            else channel.unary_unary
        stub = kind("/" + method,
                    request_serializer=type(request).SerializeToString,
                    response_deserializer=response_cls.FromString)
        result = stub(request, timeout=10, metadata=metadata)
        if m.server_streaming:
            list(result)
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    finally:
        channel.close()


def reflection_list(address, metadata=None):
    """One list_services over reflection: (first response, final code)."""
    channel = grpc.insecure_channel(address)
    try:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
            timeout=10, metadata=metadata)
        first = next(responses)
        code = grpc.StatusCode.OK
        try:
            for _ in responses:
                pass
        except grpc.RpcError as e:
            code = e.code()
        return first, code
    finally:
        channel.close()


def turn(client, sid, ids=None, n=8, rewind=False, request_id=None):
    """A greedy speculative session turn of up to n tokens."""
    req = {"session": {"session_id": sid,
                       "mode": "REWIND" if rewind else "APPEND"},
           "stopping": {"max_tokens": n, "ignore_eos": True},
           "speculation": {"enable": True, "k": 3},
           "response": {"ids": True}}
    req["token_ids"] = {"ids": list(ids or [])}
    if request_id:
        req["request_id"] = request_id
    return req


def session_with_a_turn(client, seed):
    """A session of `client`'s tenant with one turn: (id, prompt, ids)."""
    sid = client.call(OPEN, capacity=512).session_id
    prompt = u.prompt_ids(seed)
    r = u.generate_ok(client, turn(client, sid, prompt))
    assert len(r.ids) >= 8, r
    return sid, prompt, list(r.ids)


def assert_continues_exactly(cluster, client, sid, prompt, history_ids,
                             rebuilt=False):
    """The session's next turn equals specgen's continuation of its
    history; `rebuilt`: whether it had to be rebuilt (else from cache)."""
    r = u.generate_ok(client, turn(client, sid, n=8))
    want = u.specgen(prompt, len(history_ids) + len(r.ids), ignore_eos=True)
    assert history_ids + list(r.ids) == want, (r, want)
    assert len(r.ids) >= 8, r
    if rebuilt:
        assert r.final.usage.cached_prompt_tokens == 0, r
        assert "session %s rebuilt" % sid in cluster.scheduler.text()
    else:
        assert r.final.usage.cached_prompt_tokens > 0, r
        assert "session %s rebuilt" % sid not in cluster.scheduler.text()
    return list(r.ids)


# ---------------------------------------------------------------------------
# Authentication


def test_no_token_is_unauthenticated(cluster):
    calls = [
        (GENERATE, {"text": "x = ", "stopping": {"max_tokens": 2}}),
        (OPEN, {}),
        (LIST, {}),
        (TOKENIZE, {"text": "hello"}),
        (INFO, {}),
    ]
    for method, fields in calls:
        code, details = raw_call(cluster, method, fields)
        assert code == grpc.StatusCode.UNAUTHENTICATED, (method, code)
        assert "missing credentials" in details and \
            "authorization: Bearer TOKEN" in details, (method, details)
    # Reflection too: its answer carries the refusal, not the schema.
    first, code = reflection_list(cluster.scheduler.address)
    assert first.WhichOneof("message_response") == "error_response", first
    assert first.error_response.error_code == \
        grpc.StatusCode.UNAUTHENTICATED.value[0]
    assert "missing credentials" in first.error_response.error_message
    assert code == grpc.StatusCode.UNAUTHENTICATED
    # Nothing was opened or run.
    assert cluster.client.call(INFO).workers[0].sessions == 0


def test_bad_token_is_unauthenticated(cluster):
    cases = [
        ([("authorization", "Bearer not-a-token-0123456789")],
         "invalid bearer token"),
        ([("authorization", "Bearer " + ALICE + "x")], "invalid bearer token"),
        ([("authorization", ALICE)], "must be 'Bearer TOKEN'"),
        ([("authorization", "Basic " + ALICE)], "must be 'Bearer TOKEN'"),
    ]
    for metadata, why in cases:
        for method, fields in [(INFO, {}), (LIST, {}), (
                GENERATE, {"text": "x = ", "stopping": {"max_tokens": 2}})]:
            code, details = raw_call(cluster, method, fields, metadata)
            assert code == grpc.StatusCode.UNAUTHENTICATED, (method, metadata)
            assert why in details, (method, details)
    first, code = reflection_list(
        cluster.scheduler.address,
        [("authorization", "Bearer not-a-token-0123456789")])
    assert first.error_response.error_code == \
        grpc.StatusCode.UNAUTHENTICATED.value[0]
    assert code == grpc.StatusCode.UNAUTHENTICATED
    # With a valid token reflection works (every client here relies on it).
    first, code = reflection_list(cluster.scheduler.address,
                                  [("authorization", "Bearer " + BOB)])
    names = [s.name for s in first.list_services_response.service]
    assert "specserve.v1.Generation" in names and code == grpc.StatusCode.OK


def test_health_needs_no_token(cluster):
    channel = grpc.insecure_channel(cluster.scheduler.address)
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ["", "specserve.v1.Generation", "specserve.v1.Admin"]:
            resp = stub.Check(health_pb2.HealthCheckRequest(service=service),
                              timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING, \
                service
    finally:
        channel.close()


def test_tools_send_the_token(cluster):
    """specserve_cli (--token or $SPECSERVE_TOKEN) and tools/rpc/rpc
    (--token= or $SPECSERVE_TOKEN)."""
    cli = os.path.join(procs.BIN_DIR, "tools", "specserve_cli",
                       "specserve_cli")
    rpc = os.path.join(procs.REPO, "tools", "rpc", "rpc")
    address = cluster.scheduler.address
    env = dict(os.environ)
    env.pop("SPECSERVE_TOKEN", None)

    def run(args, token=None):
        e = dict(env)
        if token:
            e["SPECSERVE_TOKEN"] = token
        return subprocess.run(args, capture_output=True, text=True,
                              timeout=60, env=e)

    refused = run([cli, "--address", address, "session", "list"])
    assert refused.returncode == 1
    assert "UNAUTHENTICATED" in refused.stderr and "--token" in \
        refused.stderr, refused.stderr
    ok = run([cli, "--address", address, "--token", ALICE, "tokenize",
              "hello"])
    assert ok.returncode == 0, ok.stderr
    ok = run([cli, "--address", address, "session", "list"], token=BOB)
    assert ok.returncode == 0, ok.stderr
    denied = run([cli, "--address", address, "--token", BOB, "abort",
                  "--request-id", "x"])
    assert denied.returncode == 1 and "NOT_FOUND" in denied.stderr
    listed = run([sys.executable, rpc, "--token=" + BOB, address, "list"])
    assert listed.returncode == 0, listed.stderr
    assert "specserve.v1.Generation" in listed.stdout.split()
    called = run([sys.executable, rpc, address, "call", INFO, "{}"],
                 token=OPS)
    assert called.returncode == 0 and '"version"' in called.stdout, \
        called.stderr
    without = run([sys.executable, rpc, address, "call", INFO, "{}"])
    assert without.returncode == 1 and "missing credentials" in \
        without.stderr, without.stderr


# ---------------------------------------------------------------------------
# Tenants


def test_other_tenant_cannot_touch_a_session_and_it_stays_unchanged(cluster):
    alice, bob = cluster.alice, cluster.bob
    sid, prompt, ids = session_with_a_turn(alice, seed=301)
    before = alice.call(GET, session_id=sid)
    assert before.committed_tokens == len(prompt) + len(ids)

    assert sid not in [s.session_id for s in bob.call(LIST).sessions]
    assert sid in [s.session_id for s in alice.call(LIST).sessions]
    # Every attempt reads as an unknown id: the same code and message.
    _, unknown = u.rpc_code(bob.call, GET, session_id=UNKNOWN_SESSION)
    attempts = {
        "get": lambda: u.rpc_code(bob.call, GET, session_id=sid),
        "close": lambda: u.rpc_code(bob.call, CLOSE, session_id=sid),
        "abort": lambda: u.rpc_code(bob.call, ABORT, session_id=sid),
    }
    for name, attempt in attempts.items():
        code, details = attempt()
        assert code == grpc.StatusCode.NOT_FOUND, name
        assert details.replace(sid, UNKNOWN_SESSION) == unknown, (name,
                                                                  details)
    for name, req in [("continue", turn(bob, sid)),
                      ("append", turn(bob, sid, [17, 42, 99])),
                      ("rewind", turn(bob, sid, [17, 42], rewind=True))]:
        r = u.generate(bob, req)
        assert r.code == grpc.StatusCode.NOT_FOUND, (name, r)
        assert r.details.replace(sid, UNKNOWN_SESSION) == unknown, (name, r)
        assert not r.ids, (name, r)

    after = alice.call(GET, session_id=sid)
    assert after.committed_tokens == before.committed_tokens
    assert after.rewind_pos == before.rewind_pos == len(prompt)
    assert u.enum_name(after, "residency") == "PARKED"
    assert_continues_exactly(cluster, alice, sid, prompt, ids)
    alice.call(CLOSE, session_id=sid)


def test_other_tenant_cannot_abort_a_running_request(cluster):
    alice, bob = cluster.alice, cluster.bob
    req = {"token_ids": {"ids": u.prompt_ids(302)},
           "stopping": {"max_tokens": 2000, "ignore_eos": True},
           "request_id": "shared-id", "response": {"ids": True}}
    stream = u.Stream(alice, req)
    stream.wait_tokens(4)
    code, details = u.rpc_code(bob.call, ABORT, request_id="shared-id")
    assert code == grpc.StatusCode.NOT_FOUND, (code, details)
    assert details == "request shared-id is not running"
    code, _ = u.rpc_code(bob.call, ABORT, all=True)
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert stream.result.ended_at is None, "alice's request ended too soon"
    # Request ids are per tenant: bob's own "shared-id" runs beside alice's.
    mine = u.generate_ok(bob, {"token_ids": {"ids": u.prompt_ids(303)},
                               "stopping": {"max_tokens": 2},
                               "request_id": "shared-id"})
    assert mine.final.request_id == "shared-id"
    r = stream.join()
    assert r.ok, r
    assert u.finish_name(r) == "LENGTH" and len(r.ids) >= 2000, r


def test_user_role_cannot_drain_load_or_abort_everything(cluster, token_file):
    bob = cluster.bob
    for method, fields in [(DRAIN, {}), (LOAD, {"model_dir": u.DEFAULT_MODEL}),
                           (ABORT, {"all": True})]:
        code, details = u.rpc_code(bob.call, method, **fields)
        assert code == grpc.StatusCode.PERMISSION_DENIED, (method, code)
        assert "needs role admin" in details, details
    # Still serving, with nothing drained or restarted.
    info = bob.call(INFO)
    assert not info.draining and all(w.available for w in info.workers)
    assert bob.health("") == "SERVING"
    u.generate_ok(bob, {"text": "x = ", "stopping": {"max_tokens": 2}})

    # Admin passes the role check: an abort of everything, a LoadModel that
    # gets as far as checking its directory (a real switch is
    # test_load_model.py's), and a drain (on a second scheduler).
    ops = cluster.client
    assert ops.call(ABORT, all=True).aborted == 0
    code, details = u.rpc_code(ops.call, LOAD, model_dir="/nonexistent")
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "/nonexistent" in \
        details
    extra = cluster.add_scheduler([cluster.workers[0].address],
                                  ["--auth_tokens=" + token_file])
    extra_bob = cluster.client_for(extra, token=BOB)
    code, _ = u.rpc_code(extra_bob.call, DRAIN)
    assert code == grpc.StatusCode.PERMISSION_DENIED
    extra_ops = cluster.client_for(extra, token=OPS)
    assert extra_ops.call(DRAIN).in_flight == 0
    u.wait_until(lambda: extra_ops.health("") == "NOT_SERVING",
                 what="health NOT_SERVING after the admin's drain")
    extra.signal(signal.SIGTERM)
    assert extra.wait(15) == 0, extra.text()


def test_sighup_reloads_the_token_file(cluster, token_file):
    ops = cluster.client
    new = cluster.client_for(cluster.scheduler, token=NEW)
    old = cluster.client_for(cluster.scheduler, token=OLD)
    assert old.call(INFO).version
    assert raw_call(cluster, INFO, metadata=[
        ("authorization", "Bearer " + NEW)])[0] == \
        grpc.StatusCode.UNAUTHENTICATED

    def reload(text, log):
        with open(token_file, "w") as f:
            f.write(text)
        seen = cluster.scheduler.text().count(log)
        cluster.scheduler.signal(signal.SIGHUP)
        u.wait_until(lambda: cluster.scheduler.text().count(log) > seen,
                     what="the scheduler to log %r" % log)

    try:
        reload(TOKENS.replace(OLD, NEW), "SIGHUP: reloaded 4 credential(s)")
        assert new.call(INFO).version
        code, details = raw_call(cluster, INFO, metadata=[
            ("authorization", "Bearer " + OLD)])
        assert code == grpc.StatusCode.UNAUTHENTICATED, code
        assert "invalid bearer token" in details
        # A file that does not parse keeps the tokens in force.
        reload(TOKENS.replace(OLD, NEW) + "short bad line\n",
               "the credentials in force stay")
        assert "tokens.txt line 7: the token is shorter than 16" in \
            cluster.scheduler.text()
        assert new.call(INFO).version
        assert ops.call(INFO).version
        assert cluster.scheduler.popen.poll() is None
    finally:
        with open(token_file, "w") as f:
            f.write(TOKENS)


# ---------------------------------------------------------------------------
# The worker port, called directly


def test_direct_admit_and_burst_run_as_an_isolated_session(cluster):
    worker = cluster.worker
    alice_sid, prompt, ids = session_with_a_turn(cluster.alice, seed=304)
    foreign_prompt = u.prompt_ids(305)
    foreign = "ses_made_up_by_a_direct_caller"
    worker.call(W_ADMIT, session_id=foreign, capacity=256)
    events = worker.call(W_BURST, session_id=foreign, suffix=foreign_prompt,
                         max_new=8, k=0, timeout=60)
    got = [t for e in events if e.HasField("tokens") for t in e.tokens.ids]
    assert got == u.specgen(foreign_prompt, 8, ignore_eos=True)
    # The direct caller's view of the worker lists its own session only.
    listed = [s.session_id for s in worker.call(
        u.WORKER_INFO).session_list.sessions]
    assert listed == [foreign], listed
    # The scheduler knows nothing of it, and its own session is untouched.
    assert foreign not in [s.session_id for s in cluster.client.call(
        LIST).sessions]
    worker.call(W_RELEASE, session_id=foreign)
    assert_continues_exactly(cluster, cluster.alice, alice_sid, prompt, ids)
    cluster.alice.call(CLOSE, session_id=alice_sid)


def test_direct_release_and_burst_on_a_scheduler_session_fail(cluster):
    worker, alice = cluster.worker, cluster.alice
    sid, prompt, ids = session_with_a_turn(alice, seed=306)
    held = worker.call(W_STATE, session_id=sid, owner=u.WORKER_OWNER)
    assert held.committed_len + (1 if held.HasField("pending_tok") else 0) \
        == len(prompt) + len(ids)
    _, unknown = u.rpc_code(worker.call, W_RELEASE,
                            session_id=UNKNOWN_SESSION)
    # Knowing the session id is not enough, nor is a guessed owner.
    for owner in ["", "own_" + "0" * 32]:
        attempts = {
            "release": lambda: u.rpc_code(worker.call, W_RELEASE,
                                          session_id=sid, owner=owner),
            "burst": lambda: u.rpc_code(
                worker.call, W_BURST, session_id=sid, owner=owner,
                suffix=u.prompt_ids(307, n=9), max_new=8, k=0),
            "state": lambda: u.rpc_code(worker.call, W_STATE, session_id=sid,
                                        owner=owner),
            "stop": lambda: u.rpc_code(worker.call, W_STOP, session_id=sid,
                                       owner=owner),
        }
        for name, attempt in attempts.items():
            code, details = attempt()
            assert code == grpc.StatusCode.NOT_FOUND, (name, owner, code)
            if name != "stop":
                assert details.replace(sid, UNKNOWN_SESSION) == unknown, (
                    name, details)
    listed = [s.session_id for s in worker.call(
        u.WORKER_INFO).session_list.sessions]
    assert sid not in listed
    # The owner's copy is as it was, and the next turn continues from it.
    still = worker.call(W_STATE, session_id=sid, owner=u.WORKER_OWNER)
    assert still.committed_len == held.committed_len
    assert still.HasField("pending_tok") == held.HasField("pending_tok")
    assert_continues_exactly(cluster, alice, sid, prompt, ids)
    alice.call(CLOSE, session_id=sid)


def test_copy_changed_behind_the_schedulers_back_is_rebuilt(cluster):
    """Even a caller holding the owner token (a bug, a leaked token) cannot
    make the scheduler continue from a copy its history does not describe:
    the next burst's expect_history_len is refused (FAILED_PRECONDITION) and
    the session is rebuilt from the history, exactly."""
    worker, alice = cluster.worker, cluster.alice
    sid, prompt, ids = session_with_a_turn(alice, seed=308)
    events = worker.call(W_BURST, session_id=sid, owner=u.WORKER_OWNER,
                         suffix=u.prompt_ids(309, n=9), max_new=8, k=0,
                         timeout=60)
    assert any(e.HasField("summary") for e in events)
    # The copy now holds 9 + 8 tokens more than the scheduler's history ...
    assert alice.call(GET, session_id=sid).committed_tokens == \
        len(prompt) + len(ids)
    # ... and the next turn continues the history, not the copy.
    assert_continues_exactly(cluster, alice, sid, prompt, ids, rebuilt=True)
    assert "tokens of history here, the caller expects %d" % (
        len(prompt) + len(ids)) in cluster.scheduler.text()
    alice.call(CLOSE, session_id=sid)
