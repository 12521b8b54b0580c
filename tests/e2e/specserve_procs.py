"""Starts real specserve processes on free loopback ports for end-to-end tests.

Binaries come from bazel-bin (tools/test builds them first); override with
SPECSERVE_BIN_DIR. Each process is started with --listen 127.0.0.1:0 and its
port is read from the "listening on port N" line it prints.
"""
import os
import re
import signal
import subprocess
import threading
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN_DIR = os.environ.get("SPECSERVE_BIN_DIR", os.path.join(REPO, "bazel-bin"))
DEFAULT_MODEL = os.environ.get(
    "SPECSERVE_TEST_MODEL", os.path.join(REPO, "tests", "models", "tiny_a"))

_PORT_RE = re.compile(rb"listening on port (\d+)")


class Proc:
    """A child process whose output is collected in the background."""

    def __init__(self, args, name):
        self.name = name
        self.args = args
        self.output = bytearray()
        self.port = None
        self._port_seen = threading.Event()
        self.popen = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in iter(self.popen.stdout.readline, b""):
            self.output += line
            m = _PORT_RE.search(line)
            if m and self.port is None:
                self.port = int(m.group(1))
                self._port_seen.set()
        self._port_seen.set()  # process ended: stop waiting

    def wait_port(self, timeout=30.0):
        self._port_seen.wait(timeout)
        if self.port is None:
            raise RuntimeError("%s did not start: %s" % (self.name, self.text()))
        return self.port

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    def text(self):
        return self.output.decode("utf-8", "replace")

    def signal(self, sig):
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def wait(self, timeout):
        return self.popen.wait(timeout)

    def stop(self):
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGCONT)
            self.popen.kill()
            self.popen.wait(10)


def start_worker(model=DEFAULT_MODEL, port=0, extra=()):
    p = Proc([os.path.join(BIN_DIR, "worker", "specserve_worker"),
              "--listen=127.0.0.1:%d" % port, "--model=" + model,
              "--device=cpu"] + list(extra), "worker")
    p.wait_port()
    return p


def start_scheduler(worker_addresses, model=DEFAULT_MODEL, extra=()):
    extra = list(extra)
    # Prefix reuse keeps finished one-shot requests parked on their workers;
    # tests that count a worker's sessions run without it unless they ask
    # (tests/e2e/test_prefix_reuse.py does).
    if not any(a.startswith("--prefix_cache_sessions") for a in extra):
        extra.append("--prefix_cache_sessions=0")
    p = Proc([os.path.join(BIN_DIR, "scheduler", "specserve_scheduler"),
              "--listen=127.0.0.1:0", "--workers=" + ",".join(worker_addresses),
              "--model=" + model, "--worker_poll_ms=200"] + extra,
             "scheduler")
    p.wait_port()
    return p


def wait_until(predicate, timeout=10.0, interval=0.02, what="condition"):
    """Polls `predicate` until truthy and returns its value; raises
    AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.1f s waiting for %s"
                                 % (timeout, what))
        time.sleep(interval)
