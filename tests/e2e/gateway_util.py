"""The SMG gateway (PyPI `smg`, installed by tools/install_deps) in front of
specserve schedulers, for tests/e2e/test_gateway.py: a real `smg launch`
process speaking the vLLM engine protocol (vllm.grpc.engine.VllmEngine) to
each scheduler, and the official `openai` client against its HTTP API.

SMG runs in a fresh temporary folder, so the tokenizer path the schedulers
report (the workers' relative model path) does not exist for it: it builds
its tokenizer and chat template from the bundle VllmEngine.GetTokenizer
streams. Every wait is bounded.
"""
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import urllib.error
import urllib.request

import specserve_procs as procs

MODEL_ID = "default"  # the served name of models/default


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def smg_binary():
    path = shutil.which("smg")
    assert path, "smg is not installed: run tools/install_deps"
    return path


class Smg:
    """One `smg launch` process routing to the given scheduler addresses."""

    def __init__(self, scheduler_addresses, extra=()):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="specserve-smg-")
        self.args = [smg_binary(), "launch",
                     "--host", "127.0.0.1", "--port", str(self.port),
                     "--prometheus-host", "127.0.0.1",
                     "--prometheus-port", str(free_port()),
                     "--worker-urls"] + [
            "grpc://" + a for a in scheduler_addresses] + [
            "--policy", "round_robin",
            "--health-check-interval-secs", "1",
            "--health-failure-threshold", "2",
            "--health-success-threshold", "1",
            "--log-level", "warn"] + list(extra)
        self.output = bytearray()
        self.popen = subprocess.Popen(self.args, cwd=self.dir,
                                      stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            procs.wait_until(lambda: self._ready(len(scheduler_addresses)),
                             timeout=60, interval=0.2,
                             what="SMG serving its workers")
        except BaseException:
            self.stop()
            raise

    def _read(self):
        for line in iter(self.popen.stdout.readline, b""):
            self.output += line

    def text(self):
        return self.output.decode("utf-8", "replace")

    @property
    def base_url(self):
        return "http://127.0.0.1:%d" % self.port

    def get_json(self, path):
        with urllib.request.urlopen(self.base_url + path, timeout=10) as r:
            return json.loads(r.read().decode())

    def post(self, path, body):
        """(HTTP status, parsed JSON body) of a POST."""
        req = urllib.request.Request(
            self.base_url + path, data=json.dumps(body).encode(),
            headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read().decode())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read().decode() or "{}")

    def workers(self):
        return self.get_json("/workers")["workers"]

    def _ready(self, n):
        assert self.popen.poll() is None, "smg exited: " + self.text()[-3000:]
        try:
            models = self.get_json("/v1/models")["data"]
            workers = self.workers()
        except (OSError, ValueError, KeyError):
            return False
        return (any(m["id"] == MODEL_ID for m in models) and
                sum(1 for w in workers if w.get("is_healthy")) == n)

    def openai(self):
        import openai
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key="unused",
                             max_retries=0, timeout=60)

    def stop(self):
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)
