"""End-to-end checks of the walking skeleton with real processes on loopback:
reflection-only clients, health, server info, worker restart, drain, errors."""
import json
import os
import signal
import subprocess
import time

import grpc
import pytest

import specserve_procs as procs
from reflection_client import ReflectionClient

PUBLIC_SERVICES = ["specserve.v1.Admin", "specserve.v1.Generation",
                   "specserve.v1.Sessions", "specserve.v1.Tokenization"]


@pytest.fixture(scope="module")
def cluster():
    worker = procs.start_worker()
    scheduler = procs.start_scheduler([worker.address])
    client = ReflectionClient(scheduler.address)
    procs.wait_until(lambda: client.call(
        "specserve.v1.Admin/GetServerInfo").workers[0].available, timeout=10)
    yield {"worker": worker, "scheduler": scheduler, "client": client}
    client.close()
    scheduler.stop()
    worker.stop()


def test_reflection_lists_every_public_service(cluster):
    services = cluster["client"].services()
    for name in PUBLIC_SERVICES + ["grpc.health.v1.Health"]:
        assert name in services, services


def test_reflection_describes_every_rpc(cluster):
    client = cluster["client"]
    for name in PUBLIC_SERVICES:
        service = client.pool.FindServiceByName(name)
        assert service.methods, name
        for m in service.methods:
            # Both message types resolve through reflection alone.
            assert client.message_class(m.input_type) is not None
            assert client.message_class(m.output_type) is not None


def test_health_serving_for_server_and_each_service(cluster):
    client = cluster["client"]
    assert client.health("") == "SERVING"
    for name in PUBLIC_SERVICES:
        assert client.health(name) == "SERVING", name


def test_server_info_lists_worker_and_model_config(cluster):
    info = cluster["client"].call("specserve.v1.Admin/GetServerInfo")
    assert len(info.workers) == 1
    w = info.workers[0]
    assert w.available and w.address == cluster["worker"].address
    assert w.device == "cpu"
    with open(os.path.join(procs.DEFAULT_MODEL, "config.json")) as f:
        config = json.load(f)
    config = config.get("text_config", config)
    assert info.model.hidden_size == config["hidden_size"]
    assert info.model.vocab_size == config["vocab_size"]
    assert info.model.num_layers == config["num_hidden_layers"]
    assert len(info.model.layer_types) == config["num_hidden_layers"]
    assert info.model.has_mtp == (config.get("mtp_num_hidden_layers", 0) > 0)
    model = cluster["client"].call("specserve.v1.Admin/GetModelInfo")
    assert model.hidden_size == config["hidden_size"]


def test_worker_serves_reflection_and_health(cluster):
    client = ReflectionClient(cluster["worker"].address)
    try:
        assert "specserve.worker.v1.Worker" in client.services()
        assert client.health("") == "SERVING"
        assert client.health("specserve.worker.v1.Worker") == "SERVING"
        info = client.call("specserve.worker.v1.Worker/GetWorkerInfo")
        assert info.pid == cluster["worker"].popen.pid
    finally:
        client.close()


def test_load_model_of_a_missing_directory_says_so(cluster):
    client = cluster["client"]
    with pytest.raises(grpc.RpcError) as e:
        client.call("specserve.v1.Admin/LoadModel", model_dir="/nonexistent")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "cannot load /nonexistent" in e.value.details()


def _available(client):
    return client.call("specserve.v1.Admin/GetServerInfo").workers[0].available


def test_killed_worker_is_reported_then_rejoins_after_restart():
    worker = procs.start_worker()
    port = worker.port
    scheduler = procs.start_scheduler([worker.address])
    client = ReflectionClient(scheduler.address)
    try:
        assert procs.wait_until(lambda: _available(client), timeout=10)
        worker.signal(signal.SIGKILL)
        worker.wait(5)
        assert procs.wait_until(lambda: not _available(client), timeout=5)
        info = client.call("specserve.v1.Admin/GetServerInfo")
        assert info.workers[0].detail  # says why
        # The scheduler keeps serving while its worker is gone.
        assert client.health("") == "SERVING"
        worker = procs.start_worker(port=port)
        assert procs.wait_until(lambda: _available(client), timeout=10)
    finally:
        client.close()
        scheduler.stop()
        worker.stop()


def test_sigterm_drains_and_exits_zero():
    worker = procs.start_worker()
    scheduler = procs.start_scheduler([worker.address])
    try:
        scheduler.signal(signal.SIGTERM)
        assert scheduler.wait(15) == 0, scheduler.text()
        assert "drain requested" in scheduler.text()
        worker.signal(signal.SIGTERM)
        assert worker.wait(15) == 0, worker.text()
    finally:
        scheduler.stop()
        worker.stop()


def test_drain_rpc_turns_health_not_serving():
    worker = procs.start_worker()
    scheduler = procs.start_scheduler([worker.address],
                                      extra=["--drain_grace_seconds=5"])
    client = ReflectionClient(scheduler.address)
    try:
        assert client.call("specserve.v1.Admin/Drain").in_flight == 0
        procs.wait_until(lambda: client.health("") == "NOT_SERVING",
                         what="health NOT_SERVING")
        # A drain stops new work, not the process: it stays up (and keeps
        # answering) until SIGTERM.
        procs.wait_until(lambda: "drained: refusing new work until SIGTERM"
                         in scheduler.text(), what="drain over")
        assert scheduler.popen.poll() is None, scheduler.text()
        assert client.call("specserve.v1.Admin/GetServerInfo").draining
        scheduler.signal(signal.SIGTERM)
        assert scheduler.wait(15) == 0, scheduler.text()
    finally:
        client.close()
        scheduler.stop()
        worker.stop()


def test_bad_model_dir_fails_with_a_message_naming_the_file(tmp_path):
    (tmp_path / "config.json").write_text("{ not json")
    p = subprocess.run(
        [os.path.join(procs.BIN_DIR, "worker", "specserve_worker"),
         "--listen=127.0.0.1:0", "--model=" + str(tmp_path)],
        capture_output=True, text=True, timeout=30)
    assert p.returncode != 0
    assert "config.json" in p.stderr
