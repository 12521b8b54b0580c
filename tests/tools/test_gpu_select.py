"""tools/gpu_select: the devices tools/serve starts one worker on, from what a
(fake) nvidia-smi lists and CUDA_VISIBLE_DEVICES."""
import os
import subprocess

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SELECT = os.path.join(REPO, "tools", "gpu_select")


def _run(tmp_path, spec=None, gpus=0, visible=None):
    """Runs gpu_select with a fake nvidia-smi listing `gpus` GPUs (None: no
    nvidia-smi on PATH at all)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    if gpus is not None:
        lines = "".join("GPU %d: NVIDIA H200 (UUID: GPU-%d)\\n" % (i, i)
                        for i in range(gpus))
        fake = bindir / "nvidia-smi"
        fake.write_text("#!/bin/sh\nprintf '%s'\n" % lines)
        fake.chmod(0o755)
    env = {"PATH": "%s:/usr/bin:/bin" % bindir}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    args = [SELECT] + ([spec] if spec is not None else [])
    r = subprocess.run(args, env=env, capture_output=True, text=True,
                       timeout=30)
    return r.returncode, r.stdout.split(), r.stderr


def test_all_visible_gpus_by_default(tmp_path):
    assert _run(tmp_path, gpus=4) == (0, ["cuda:0", "cuda:1", "cuda:2",
                                          "cuda:3"], "")
    assert _run(tmp_path, "all", gpus=2)[:2] == (0, ["cuda:0", "cuda:1"])


def test_no_gpu_means_one_cpu_worker(tmp_path):
    assert _run(tmp_path, gpus=None)[:2] == (0, ["cpu"])
    assert _run(tmp_path, gpus=0)[:2] == (0, ["cpu"])


def test_cuda_visible_devices_narrows_the_set(tmp_path):
    assert _run(tmp_path, gpus=8, visible="3,5")[:2] == (0, ["cuda:0",
                                                            "cuda:1"])
    assert _run(tmp_path, gpus=8, visible="")[:2] == (0, ["cpu"])


def test_count_and_list(tmp_path):
    assert _run(tmp_path, "2", gpus=4)[:2] == (0, ["cuda:0", "cuda:1"])
    assert _run(tmp_path, "3,1", gpus=4)[:2] == (0, ["cuda:3", "cuda:1"])


@pytest.mark.parametrize("spec,gpus,visible,says", [
    ("5", 4, None, "more GPUs than are visible"),
    ("1", 0, None, "more GPUs than are visible"),
    ("0", 4, None, "at least one GPU"),
    ("0,4", 4, None, "index 4 is not a visible GPU"),
    ("1,1", 4, None, "listed twice"),
    ("2", 8, "6", "more GPUs than are visible"),
    ("two", 4, None, "expected all, a count"),
])
def test_bad_choices_are_refused_naming_what_is_visible(tmp_path, spec, gpus,
                                                        visible, says):
    rc, out, err = _run(tmp_path, spec, gpus=gpus, visible=visible)
    assert rc == 2 and out == []
    assert says in err and "GPU(s) visible" in err, err
