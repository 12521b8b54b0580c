"""Admin.LoadModel with real processes: a bad directory changes nothing; a
good one restarts every worker on it (same port), swaps the tokenizer and
closes the sessions; it is refused while a request runs; and back again."""
import os

import grpc

import e2e_util as u
import specserve_procs as procs

TINY = os.path.join(procs.REPO, "tests", "models", "tiny_c")  # no tokenizer.json
LOAD = "specserve.v1.Admin/LoadModel"


def _model(c):
    return c.call("specserve.v1.Admin/GetModelInfo")


def _load(c, model_dir):
    """LoadModel, retried while a just-cancelled request is still winding
    down (FAILED_PRECONDITION)."""
    def attempt():
        try:
            return c.call(LOAD, timeout=120, model_dir=model_dir)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            return None
    return u.wait_until(attempt, timeout=10, what="no request running").model


def test_load_model_switches_every_worker_and_back():
    cluster = u.Cluster(n_workers=2)
    try:
        c = cluster.client
        before = _model(c)
        assert before.path == u.DEFAULT_MODEL
        session = c.call("specserve.v1.Sessions/OpenSession").session_id
        worker_pids = [w.popen.pid for w in cluster.workers]

        # A directory that is not a model: refused, nothing changed.
        code, details = u.rpc_code(c.call, LOAD, model_dir=TINY + "_missing")
        assert code == grpc.StatusCode.INVALID_ARGUMENT, details
        assert "cannot load" in details
        assert _model(c).path == u.DEFAULT_MODEL
        c.call("specserve.v1.Sessions/GetSession", session_id=session)

        # Refused while a request runs.
        holder = u.Stream(c, {"token_ids": {"ids": [1, 2, 3]},
                              "stopping": {"max_tokens": 4000, "ignore_eos": True},
                              "response": {"ids": True}})
        holder.wait_tokens(1)
        code, details = u.rpc_code(c.call, LOAD, model_dir=TINY)
        assert code == grpc.StatusCode.FAILED_PRECONDITION, details
        assert "running" in details
        holder.cancel()
        holder.join()

        # The switch: every worker restarts on TINY in place (same process id
        # and port), the sessions are closed, text input goes away (TINY has
        # no tokenizer.json), and ids in the new vocabulary generate.
        loaded = _load(c, TINY)
        assert loaded.path == TINY and loaded.vocab_size != before.vocab_size
        info = c.call("specserve.v1.Admin/GetServerInfo")
        assert all(w.available and w.model.path == TINY for w in info.workers)
        assert [w.popen.pid for w in cluster.workers] == worker_pids
        code, _ = u.rpc_code(c.call, "specserve.v1.Sessions/GetSession", session_id=session)
        assert code == grpc.StatusCode.NOT_FOUND
        code, _ = u.rpc_code(c.call, "specserve.v1.Tokenization/Tokenize", text="hi")
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        r = u.generate_ok(c, {"token_ids": {"ids": [1, 2, 3]},
                              "stopping": {"max_tokens": 8, "ignore_eos": True},
                              "response": {"ids": True}})
        assert len(r.ids) == 8 and max(r.ids) < loaded.vocab_size

        # And back: the default model and its tokenizer serve text again.
        assert _load(c, u.DEFAULT_MODEL).path == u.DEFAULT_MODEL
        assert c.call("specserve.v1.Tokenization/Tokenize", text="hi").ids
        u.generate_ok(c, {"text": "def f(x):", "stopping": {"max_tokens": 6}})
    finally:
        cluster.stop()
