"""TLS and mutual TLS (docs/RELIABILITY.md row 11) with real certificates made
by tools/make_certs (openssl) in a temporary folder: two CAs, "a" and "b".

On the public port: plaintext and untrusted servers fail, TLS with the right
CA works, and with --tls_client_ca a client without a certificate or with
another CA's is refused. Between scheduler and worker: the worker refuses
plaintext and foreign client certificates and accepts the scheduler's; the
scheduler refuses a worker whose certificate --worker_tls_ca did not sign
(the worker shows unavailable naming the TLS failure, requests fail
UNAVAILABLE instead of hanging). grpcurl works exactly as README shows, and
`tools/serve --secure` prints grpcurl lines that work."""
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading

import grpc
import pytest

import e2e_util as u
import specserve_procs as procs
from reflection_client import ReflectionClient

MAKE_CERTS = os.path.join(procs.REPO, "tools", "make_certs")
SERVE = os.path.join(procs.REPO, "tools", "serve")
WORKER_FLAGS = ["--threads=1", u.SPEC_ALWAYS_PAYS]
SERVER_INFO = "specserve.v1.Admin/GetServerInfo"
GENERATE_REQ = {"text": "def f(x):", "stopping": {"max_tokens": 6}}


class Pki:
    """Certificates under one folder: NAME.pem and NAME.key."""

    def __init__(self, root):
        self.root = str(root)

    def path(self, name, ext="pem"):
        return os.path.join(self.root, "%s.%s" % (name, ext))

    def ca(self, name):
        subprocess.run([MAKE_CERTS, "ca", self.path(name)[:-4],
                        "test CA " + name], check=True, timeout=30)

    def leaf(self, ca, name, san=None):
        args = [MAKE_CERTS, "leaf", self.path(ca)[:-4], self.path(name)[:-4],
                name] + ([san] if san else [])
        subprocess.run(args, check=True, timeout=30)

    def read(self, name, ext="pem"):
        with open(self.path(name, ext), "rb") as f:
            return f.read()

    def credentials(self, ca, cert=None):
        """Client credentials trusting CA `ca`, presenting `cert` if given."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.read(ca),
            private_key=self.read(cert, "key") if cert else None,
            certificate_chain=self.read(cert) if cert else None)

    def server_flags(self, cert, client_ca=None, prefix=""):
        flags = ["--%stls_cert=%s" % (prefix, self.path(cert)),
                 "--%stls_key=%s" % (prefix, self.path(cert, "key"))]
        if client_ca:
            flags.append("--tls_client_ca=" + self.path(client_ca))
        return flags

    def worker_client_flags(self, ca, cert=None, server_name=None):
        """The scheduler's flags for TLS to the workers."""
        flags = ["--worker_tls_ca=" + self.path(ca)]
        if cert:
            flags += ["--worker_tls_cert=" + self.path(cert),
                      "--worker_tls_key=" + self.path(cert, "key")]
        if server_name:
            flags.append("--worker_tls_server_name=" + server_name)
        return flags


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    p = Pki(tmp_path_factory.mktemp("pki"))
    for ca in ("a", "b"):
        p.ca(ca)
    for ca, name in (("a", "a_server"), ("a", "a_client"), ("a", "a_worker"),
                     ("a", "a_sched"), ("b", "b_client"), ("b", "b_worker")):
        p.leaf(ca, name)
    # Named for localhost only: dialled at 127.0.0.1 it needs
    # --worker_tls_server_name.
    p.leaf("a", "a_worker_localhost", "DNS:localhost")
    return p


class Procs:
    """Processes and clients started by one test, stopped at its end."""

    def __init__(self):
        self.procs = []
        self.clients = []

    def worker(self, extra=()):
        w = procs.start_worker(model=u.DEFAULT_MODEL,
                               extra=WORKER_FLAGS + list(extra))
        self.procs.append(w)
        return w

    def scheduler(self, workers, extra=()):
        s = procs.start_scheduler([w.address for w in workers],
                                  model=u.DEFAULT_MODEL, extra=list(extra))
        self.procs.append(s)
        return s

    def client(self, proc, credentials=None, options=None):
        c = ReflectionClient(proc.address, credentials, options)
        self.clients.append(c)
        return c

    def stop(self):
        for c in self.clients:
            c.close()
        for p in reversed(self.procs):
            p.stop()


@pytest.fixture
def run():
    r = Procs()
    yield r
    r.stop()


def health_code(client):
    return u.rpc_code(client.health)[0]


def worker_status(client):
    return client.call(SERVER_INFO).workers[0]


def wait_worker(client, available):
    """Waits until the scheduler's first worker has been polled and is
    (un)available; returns its status."""
    def seen():
        w = worker_status(client)
        polled = w.available or w.detail not in ("", "not polled yet")
        return w if polled and w.available == available else None
    return u.wait_until(seen, timeout=20,
                        what="worker available=%s" % available)


def assert_generates(client):
    r = u.generate_ok(client, GENERATE_REQ)
    assert r.final.usage.completion_tokens > 0 and r.text, r


def generate_code(described, channel):
    """The status of a Generate sent on `channel` (which may be refused
    before reflection could describe it) with `described`'s messages."""
    req = u.make_request(described, GENERATE_REQ)
    resp_cls = described.message_class(
        described.method(u.GENERATE).output_type)
    stub = channel.unary_stream("/" + u.GENERATE,
                                request_serializer=type(req).SerializeToString,
                                response_deserializer=resp_cls.FromString)
    return u.rpc_code(lambda: list(stub(req, timeout=5)))[0]


# ---------------------------------------------------------------------------
# (a) The public port


def test_public_tls_refuses_plaintext_and_untrusted_clients(pki):
    c = u.Cluster(model=u.DEFAULT_MODEL, worker_extra=[u.SPEC_ALWAYS_PAYS],
                  scheduler_extra=pki.server_flags("a_server"),
                  scheduler_credentials=pki.credentials("a"))
    try:
        assert health_code(c.client) == grpc.StatusCode.OK
        assert_generates(c.client)
        plain = c.client_for(c.scheduler)
        code, _ = u.rpc_code(plain.call, SERVER_INFO, timeout=5)
        assert code == grpc.StatusCode.UNAVAILABLE
        # The server's certificate is not signed by the CA this client trusts.
        other = c.client_for(c.scheduler, pki.credentials("b"))
        assert health_code(other) == grpc.StatusCode.UNAVAILABLE
    finally:
        c.stop()


def test_public_mtls_requires_a_client_certificate_from_its_ca(pki, run):
    w = run.worker()
    s = run.scheduler([w], pki.server_flags("a_server", client_ca="a"))
    good = run.client(s, pki.credentials("a", "a_client"))
    wait_worker(good, True)
    assert_generates(good)
    for name, creds in (("no certificate", pki.credentials("a")),
                        ("another CA's", pki.credentials("a", "b_client")),
                        ("plaintext", None)):
        bad = run.client(s, creds)
        code, _ = u.rpc_code(bad.call, SERVER_INFO, timeout=5)
        assert code == grpc.StatusCode.UNAVAILABLE, name
        assert generate_code(good, bad.channel) == \
            grpc.StatusCode.UNAVAILABLE, name
    # The refusals left the port serving.
    assert_generates(good)


def test_tls_flags_that_do_not_fit_stop_the_process_at_start(pki):
    for extra in (["--tls_cert=" + pki.path("a_server")],
                  ["--tls_cert=" + pki.path("missing"),
                   "--tls_key=" + pki.path("a_server", "key")],
                  ["--tls_client_ca=" + pki.path("a")],
                  ["--worker_tls_cert=" + pki.path("a_sched"),
                   "--worker_tls_key=" + pki.path("a_sched", "key")]):
        p = subprocess.run(
            [os.path.join(procs.BIN_DIR, "scheduler", "specserve_scheduler"),
             "--listen=127.0.0.1:0", "--workers=127.0.0.1:1"] + extra,
            capture_output=True, text=True, timeout=30)
        assert p.returncode == 2, (extra, p.stdout, p.stderr)
        assert "listening on port" not in p.stdout, extra
    # A key that is not the certificate's: gRPC refuses it at listen time.
    p = subprocess.run(
        [os.path.join(procs.BIN_DIR, "scheduler", "specserve_scheduler"),
         "--listen=127.0.0.1:0", "--workers=127.0.0.1:1",
         "--model=" + u.DEFAULT_MODEL,
         "--tls_cert=" + pki.path("a_server"),
         "--tls_key=" + pki.path("a_client", "key")],
        capture_output=True, text=True, timeout=30)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "does --tls_key belong to --tls_cert?" in p.stderr
    # A worker names the file it could not use.
    p = subprocess.run(
        [os.path.join(procs.BIN_DIR, "worker", "specserve_worker"),
         "--listen=127.0.0.1:0", "--model=" + u.DEFAULT_MODEL,
         "--tls_cert=" + pki.path("a_worker", "key"),
         "--tls_key=" + pki.path("a_worker", "key")],
        capture_output=True, text=True, timeout=30)
    assert p.returncode == 2, p.stderr
    assert pki.path("a_worker", "key") in p.stderr
    assert "not a PEM certificate" in p.stderr


# ---------------------------------------------------------------------------
# (b) The worker's port, mutual TLS


def test_mtls_worker_accepts_only_its_ca_clients(pki, run):
    w = run.worker(pki.server_flags("a_worker", client_ca="a"))
    for name, creds in (("plaintext", None),
                        ("no certificate", pki.credentials("a")),
                        ("another CA's", pki.credentials("a", "b_client"))):
        code, _ = u.rpc_code(run.client(w, creds).call, u.WORKER_INFO,
                             timeout=5)
        assert code == grpc.StatusCode.UNAVAILABLE, name
    ok = run.client(w, pki.credentials("a", "a_sched"))
    assert health_code(ok) == grpc.StatusCode.OK
    assert ok.call(u.WORKER_INFO, timeout=10).device == "cpu"


def test_scheduler_uses_mtls_for_every_worker_call(pki, run):
    w = run.worker(pki.server_flags("a_worker", client_ca="a"))
    s = run.scheduler([w], pki.worker_client_flags("a", "a_sched"))
    c = run.client(s)
    wait_worker(c, True)
    # Generate goes through admission, placement and bursts on the worker;
    # a session adds Admit/Park/Release calls over the same channel.
    assert_generates(c)
    sid = c.call("specserve.v1.Sessions/OpenSession").session_id
    r = u.generate_ok(c, dict(GENERATE_REQ, session={"session_id": sid}))
    assert r.final.usage.completion_tokens > 0, r
    c.call("specserve.v1.Sessions/CloseSession", session_id=sid)
    assert worker_status(c).available


def test_mtls_worker_refuses_a_scheduler_without_the_right_certificate(
        pki, run):
    w = run.worker(pki.server_flags("a_worker", client_ca="a"))
    for name, extra in (
            ("plaintext", []),
            ("no client certificate", pki.worker_client_flags("a")),
            ("another CA's certificate",
             pki.worker_client_flags("a", "b_client"))):
        s = run.scheduler([w], extra)
        c = run.client(s)
        status = wait_worker(c, False)
        assert status.detail, name
        r = u.generate(c, GENERATE_REQ, timeout=10)
        assert r.code == grpc.StatusCode.UNAVAILABLE, (name, r)


# ---------------------------------------------------------------------------
# (c) The scheduler verifies the workers


def test_scheduler_refuses_a_worker_its_ca_did_not_sign(pki, run):
    # The worker would accept the scheduler (client CA a); only its own
    # certificate (CA b) is wrong for --worker_tls_ca a.
    w = run.worker(pki.server_flags("b_worker", client_ca="a"))
    s = run.scheduler([w], pki.worker_client_flags("a", "a_sched"))
    c = run.client(s)
    status = wait_worker(c, False)
    assert re.search(r"ssl|tls|handshake|certificate", status.detail, re.I), \
        status.detail
    # Refused with UNAVAILABLE once --no_worker_wait_ms (5 s) has passed,
    # well before the call's deadline.
    r = u.generate(c, GENERATE_REQ, timeout=20)
    assert r.code == grpc.StatusCode.UNAVAILABLE, r
    assert "no worker" in r.details, r
    # Trusting CA b, a scheduler takes the same worker.
    s2 = run.scheduler([w], pki.worker_client_flags("b", "a_sched"))
    c2 = run.client(s2)
    wait_worker(c2, True)
    assert_generates(c2)


def test_worker_tls_server_name_checks_another_name(pki, run):
    w = run.worker(pki.server_flags("a_worker_localhost", client_ca="a"))
    # Dialled at 127.0.0.1, a certificate for "localhost" does not match...
    s = run.scheduler([w], pki.worker_client_flags("a", "a_sched"))
    status = wait_worker(run.client(s), False)
    assert status.detail
    # ...unless that is the name to check.
    s2 = run.scheduler([w], pki.worker_client_flags(
        "a", "a_sched", server_name="localhost"))
    c2 = run.client(s2)
    wait_worker(c2, True)
    assert_generates(c2)


# ---------------------------------------------------------------------------
# (d) grpcurl, as README shows it


def grpcurl_binary():
    for path in (os.environ.get("GRPCURL"),
                 os.path.join(procs.REPO, ".deps", "bin", "grpcurl"),
                 shutil.which("grpcurl")):
        if path and os.access(path, os.X_OK):
            return path
    pytest.skip("no grpcurl: tools/install_deps puts it in .deps/bin")


def test_grpcurl_with_client_certificates(pki, run):
    grpcurl = grpcurl_binary()
    w = run.worker(pki.server_flags("a_worker", client_ca="a"))
    s = run.scheduler([w], pki.server_flags("a_server", client_ca="a") +
                      pki.worker_client_flags("a", "a_sched"))
    wait_worker(run.client(s, pki.credentials("a", "a_client")), True)
    tls = ["-cacert", pki.path("a"), "-cert", pki.path("a_client"),
           "-key", pki.path("a_client", "key")]

    def grpcurl_run(*args):
        return subprocess.run([grpcurl] + list(args), capture_output=True,
                              text=True, timeout=60)

    listed = grpcurl_run(*tls, s.address, "list")
    assert listed.returncode == 0, listed.stderr
    assert "specserve.v1.Generation" in listed.stdout.split()
    gen = grpcurl_run(*tls, "-d", '{"text": "def fibonacci(n):", '
                      '"stopping": {"maxTokens": 8}}', s.address,
                      "specserve.v1.Generation/Generate")
    assert gen.returncode == 0, gen.stderr
    assert '"delta"' in gen.stdout and '"final"' in gen.stdout, gen.stdout
    # Without the client certificate, or in plaintext, nothing.
    no_cert = grpcurl_run("-connect-timeout", "5", "-cacert", pki.path("a"),
                          s.address, "list")
    assert no_cert.returncode != 0
    plain = grpcurl_run("-connect-timeout", "5", "-plaintext", s.address,
                        "list")
    assert plain.returncode != 0


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def test_serve_secure_prints_grpcurl_lines_that_work():
    grpcurl_binary()
    p = subprocess.Popen(
        [SERVE, "--secure", "--bin", procs.BIN_DIR, "--port", "0",
         "--worker-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        cwd=procs.REPO, start_new_session=True)
    lines = []
    ready = threading.Event()

    def read():
        for line in p.stdout:
            lines.append(line.rstrip("\n"))
            if "Ctrl-C drains" in line:
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert ready.wait(45) and p.poll() is None, "\n".join(lines)
        commands = [shlex.split(line) for line in lines
                    if re.match(r"\s+\S*grpcurl ", line)]
        assert len(commands) == 3, lines
        tls_dir = os.path.dirname(commands[0][commands[0].index("-cacert")
                                              + 1])
        run = lambda cmd: subprocess.run(  # noqa: E731
            cmd, capture_output=True, text=True, timeout=30)
        listed = run(commands[0])
        assert listed.returncode == 0, listed.stderr
        assert "specserve.v1.Generation" in listed.stdout.split()
        # The worker joins at the scheduler's first health poll.
        u.wait_until(lambda: '"available": true' in run(commands[2]).stdout,
                     timeout=20, interval=0.2,
                     what="GetServerInfo shows the worker")
        gen = run(commands[1])
        assert gen.returncode == 0, gen.stderr
        assert '"final"' in gen.stdout, gen.stdout
        # SIGTERM stops both processes and removes the certificates.
        p.send_signal(signal.SIGTERM)
        p.wait(30)
        assert not os.path.exists(tls_dir), tls_dir
        u.wait_until(lambda: not group_alive(p.pid), timeout=10,
                     what="tools/serve's processes gone")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
