"""Shared helpers of the end-to-end tests: clusters of real processes, a
reflection-only Generate client (with cancellation and metadata), the specgen
reference, worker and metrics probes.

Everything here talks to the servers through reflection alone (no generated
stubs): the tests prove that a client with no .proto file can use the API.
Every wait is bounded.
"""
import functools
import os
import re
import subprocess
import threading
import time
import urllib.request

import grpc
from google.protobuf import json_format

import specserve_procs as procs
from reflection_client import ReflectionClient

GENERATE = "specserve.v1.Generation/Generate"
WORKER_INFO = "specserve.worker.v1.Worker/GetWorkerInfo"
DEFAULT_MODEL = os.path.join(procs.REPO, "models", "default")
# Step costs that make speculation pay at any batch size (the gate then never
# demotes), for tests that are not about the gate; they also skip the
# start-up measurement.
SPEC_ALWAYS_PAYS = "--step_costs=decode=1.0;verify=0.001"
# How long any single RPC of a test may take before the test fails.
RPC_TIMEOUT = 60.0
# The owner token of every scheduler a Cluster starts (--worker_owner), so
# tests can inspect its sessions on the workers (proto/worker.proto): pass
# owner=WORKER_OWNER in worker session calls.
WORKER_OWNER = "own_e2e-tests"


wait_until = procs.wait_until


# ---------------------------------------------------------------------------
# Processes


class Cluster:
    """Workers and one or more schedulers, with reflection clients."""

    def __init__(self, n_workers=1, model=DEFAULT_MODEL, worker_extra=(),
                 scheduler_extra=(), metrics=False, per_worker_extra=None,
                 scheduler=True, scheduler_credentials=None,
                 scheduler_token=None):
        """per_worker_extra: flags for worker i only (a list of lists);
        scheduler=False: start workers only (add_scheduler later);
        scheduler_credentials: grpc channel credentials for schedulers that
        serve TLS (scheduler_extra gives their --tls_* flags);
        scheduler_token: the bearer token of self.client and of the
        readiness checks (schedulers with --auth_tokens)."""
        self.model = model
        self.scheduler_credentials = scheduler_credentials
        self.scheduler_token = scheduler_token
        self.worker_extra = ["--threads=1"] + list(worker_extra)
        self.workers = []
        self.schedulers = []
        self._clients = []
        try:
            for i in range(n_workers):
                extra = list(per_worker_extra[i]) if per_worker_extra else []
                self.workers.append(procs.start_worker(
                    model=model, extra=self.worker_extra + extra))
            if scheduler:
                self.scheduler = self.add_scheduler(
                    [w.address for w in self.workers], scheduler_extra,
                    metrics=metrics)
                self.client = self.client_for(self.scheduler,
                                              scheduler_credentials,
                                              scheduler_token)
        except BaseException:
            self.stop()
            raise

    def add_scheduler(self, worker_addresses, extra=(), metrics=False):
        extra = list(extra)
        if metrics:
            extra.append("--metrics_port=0")
        if not any(a.startswith("--worker_owner") for a in extra):
            extra.append("--worker_owner=" + WORKER_OWNER)
        s = procs.start_scheduler(worker_addresses, model=self.model,
                                  extra=extra)
        self.schedulers.append(s)
        c = self.client_for(s, self.scheduler_credentials,
                            self.scheduler_token)
        wait_until(lambda: all(w.available for w in c.call(
            "specserve.v1.Admin/GetServerInfo").workers), timeout=20,
            what="every worker available at the scheduler")
        return s

    def client_for(self, proc, credentials=None, token=None):
        c = ReflectionClient(proc.address, credentials, token=token)
        self._clients.append(c)
        return c

    def worker_client(self, i):
        return self.client_for(self.workers[i])

    def worker_info(self, i):
        return self.client_for(self.workers[i]).call(WORKER_INFO)

    def restart_worker(self, i, extra=None):
        """Starts a fresh worker on worker i's port (after it was killed)."""
        old = self.workers[i]
        old.stop()
        self.workers[i] = procs.start_worker(
            model=self.model, port=old.port,
            extra=self.worker_extra if extra is None else extra)
        return self.workers[i]

    def stop(self):
        for c in self._clients:
            try:
                c.close()
            except Exception:
                pass
        for p in self.schedulers + self.workers:
            p.stop()


def worker_index_by_address(cluster, address):
    for i, w in enumerate(cluster.workers):
        if w.address == address:
            return i
    raise AssertionError("no worker at %r" % address)


def metrics_port(proc):
    m = re.search(r"metrics on port (\d+)", proc.text())
    assert m, "scheduler printed no metrics port: " + proc.text()[-2000:]
    return int(m.group(1))


def scrape(proc):
    """The scheduler's Prometheus metrics as {'name{labels}': value}."""
    url = "http://127.0.0.1:%d/metrics" % metrics_port(proc)
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            out[key] = float(value)
        except ValueError:
            pass
    return out


def metric(proc, name):
    """Sum of every series of metric `name`."""
    return sum(v for k, v in scrape(proc).items()
               if k == name or k.startswith(name + "{"))


def wait_worker_idle(cluster, i, sessions, timeout=10.0):
    """Waits until worker i runs no burst and holds `sessions` sessions;
    returns its WorkerInfo."""
    box = {}

    def idle():
        info = cluster.worker_info(i)
        box["info"] = info
        return info.active_bursts == 0 and info.sessions == sessions

    try:
        wait_until(idle, timeout=timeout, what="worker %d idle" % i)
    except AssertionError:
        raise AssertionError("worker %d not idle with %d sessions: %s"
                             % (i, sessions, box.get("info")))
    return box["info"]


# ---------------------------------------------------------------------------
# Generate through reflection


class Result:
    """Everything one Generate stream produced."""

    def __init__(self):
        self.ids = []
        self.text = ""
        self.deltas = 0
        # Every delta event as received, and their logprobs in order.
        self.delta_events = []
        self.logprobs = []
        self.final = None
        self.code = None
        self.details = ""
        self.started = time.monotonic()
        self.first_delta_at = None
        self.ended_at = None

    @property
    def ok(self):
        return self.code == grpc.StatusCode.OK

    def __repr__(self):
        return ("Result(code=%s, details=%r, ids=%d, final=%s)"
                % (self.code, self.details, len(self.ids),
                   self.final and json_format.MessageToJson(
                       self.final, indent=None)))


def make_request(client, req):
    """A GenerateRequest from a dict (proto or JSON field names)."""
    msg = client.request(GENERATE)
    json_format.ParseDict(req, msg)
    return msg


class Stream:
    """One Generate call read on a background thread; cancellable."""

    def __init__(self, client, req, timeout=RPC_TIMEOUT, metadata=None):
        m = client.method(GENERATE)
        resp_cls = client.message_class(m.output_type)
        request = req if not isinstance(req, dict) else make_request(client,
                                                                     req)
        stub = client.channel.unary_stream(
            "/" + GENERATE, request_serializer=type(request).SerializeToString,
            response_deserializer=resp_cls.FromString)
        self.result = Result()
        self.changed = threading.Condition()
        self.call = stub(request, timeout=timeout,
                         metadata=list((metadata or {}).items()) or None)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        r = self.result
        try:
            for ev in self.call:
                with self.changed:
                    if ev.HasField("delta"):
                        r.deltas += 1
                        r.delta_events.append(ev.delta)
                        r.logprobs.extend(ev.delta.logprobs)
                        r.ids.extend(ev.delta.ids)
                        r.text += ev.delta.text
                        if r.first_delta_at is None:
                            r.first_delta_at = time.monotonic()
                    elif ev.HasField("final"):
                        r.final = ev.final
                    self.changed.notify_all()
            r.code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            r.code = e.code()
            r.details = e.details() or ""
        finally:
            with self.changed:
                r.ended_at = time.monotonic()
                self.changed.notify_all()

    def wait_tokens(self, n, timeout=RPC_TIMEOUT):
        """Waits until at least n ids arrived (or the stream ended)."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while (len(self.result.ids) < n and self.result.ended_at is None):
                left = deadline - time.monotonic()
                assert left > 0, "timed out waiting for %d tokens: %r" % (
                    n, self.result)
                self.changed.wait(left)
        return self.result

    def cancel(self):
        self.call.cancel()

    def join(self, timeout=RPC_TIMEOUT):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "stream did not end in %.0f s" % (
            timeout)
        return self.result


def generate(client, req, timeout=RPC_TIMEOUT, metadata=None):
    """Runs one Generate to its end; returns a Result (never raises on a
    status)."""
    return Stream(client, req, timeout, metadata).join(timeout + 10)


def generate_ok(client, req, timeout=RPC_TIMEOUT):
    r = generate(client, req, timeout)
    assert r.ok, r
    assert r.final is not None, r
    return r


def finish_name(result):
    return result.final.DESCRIPTOR.fields_by_name["finish_reason"].enum_type \
        .values_by_number[result.final.finish_reason].name


def enum_name(message, field):
    return message.DESCRIPTOR.fields_by_name[field].enum_type \
        .values_by_number[getattr(message, field)].name


def rpc_code(fn, *args, **kwargs):
    """Calls fn; returns (StatusCode, details)."""
    try:
        fn(*args, **kwargs)
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details() or ""


# ---------------------------------------------------------------------------
# The reference: specgen (plain greedy, no server)


@functools.lru_cache(maxsize=None)
def _specgen(model, prompt, max_new, ignore_eos):
    args = [os.path.join(procs.BIN_DIR, "tools", "specgen", "specgen"),
            "--model", model, "--prompt-ids", ",".join(map(str, prompt)),
            "--max-new", str(max_new), "--threads=1"]
    if ignore_eos:
        args.append("--ignore_eos")
    p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    for line in p.stdout.splitlines():
        if line.startswith("ids:"):
            body = line[len("ids:"):].strip()
            return tuple(int(x) for x in body.split(",") if x)
    raise AssertionError("specgen printed no ids: " + p.stdout)


def specgen(prompt, max_new, model=DEFAULT_MODEL, ignore_eos=False):
    """Greedy continuation of `prompt` (list of ids), EOS included if hit."""
    return list(_specgen(model, tuple(prompt), max_new, ignore_eos))


@functools.lru_cache(maxsize=None)
def eos_ids(model=DEFAULT_MODEL):
    import json
    with open(os.path.join(model, "config.json")) as f:
        c = json.load(f)
    c = c.get("text_config", c)
    e = c.get("eos_token_id")
    if e is None:
        return frozenset()
    return frozenset(e if isinstance(e, list) else [e])


def expected_shown(prompt, n, model=DEFAULT_MODEL, ignore_eos=False):
    """What the server shows for a greedy request of up to n tokens: the
    reference continuation cut before the first EOS (the server does not
    show stop tokens)."""
    ref = specgen(prompt, n, model, ignore_eos)
    if not ignore_eos:
        for i, t in enumerate(ref):
            if t in eos_ids(model):
                return ref[:i]
    return ref


def assert_matches_reference(prompt, result, max_tokens, model=DEFAULT_MODEL,
                             ignore_eos=False, slack=9, what=""):
    """A greedy result equals the reference: the first max_tokens tokens, and
    any speculative overshoot too (it is committed and shown)."""
    got = list(result.ids)
    want = expected_shown(prompt, max_tokens + slack, model, ignore_eos)
    assert len(got) <= max_tokens + slack, (what, len(got))
    assert got == want[:len(got)], "%s: server %s != specgen %s" % (
        what, got, want[:len(got)])
    if len(want) >= max_tokens:
        assert len(got) >= max_tokens, (what, got, want)
    else:
        assert got == want, (what, got, want)  # stopped at EOS


def prompt_ids(seed, n=12, vocab=6000):
    """A deterministic pseudo-random prompt of ids."""
    import random
    rng = random.Random(seed)
    return [rng.randrange(16, vocab) for _ in range(n)]
