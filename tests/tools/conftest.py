"""pytest setup for the command-line tools' end-to-end tests: real worker and
scheduler processes on the default model (it has a tokenizer and an MTP
head), started with the helpers of tests/e2e."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))
sys.path.insert(0, os.path.join(REPO, "tools", "rpc"))
sys.path.insert(0, HERE)

import specserve_procs as procs  # noqa: E402
from reflection_client import ReflectionClient  # noqa: E402

from tools_cluster import BURST_TOKENS, DEFAULT_MODEL  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    worker = procs.start_worker(model=DEFAULT_MODEL, extra=["--threads=1"])
    try:
        scheduler = procs.start_scheduler(
            [worker.address], model=DEFAULT_MODEL,
            extra=["--burst_tokens=%d" % BURST_TOKENS])
    except Exception:
        worker.stop()
        raise
    client = ReflectionClient(scheduler.address)
    procs.wait_until(lambda: client.call(
        "specserve.v1.Admin/GetServerInfo").workers[0].available, timeout=10)
    client.close()
    yield {"worker": worker, "scheduler": scheduler}
    scheduler.stop()
    worker.stop()
