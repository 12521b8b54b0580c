"""bazel-bin/tools/specserve_cli/specserve_cli against real processes:
streaming generate (text and ids, sessions, rewind, stats), session
open/get/list/close, tokenize/detokenize, info, abort, friendly errors."""
import os
import subprocess

import pytest

from tools_cluster import REPO

CLI = os.path.join(os.environ.get("SPECSERVE_BIN_DIR",
                                  os.path.join(REPO, "bazel-bin")),
                   "tools", "specserve_cli", "specserve_cli")


@pytest.fixture(scope="module")
def cli(cluster):
    address = cluster["scheduler"].address

    def run(*args, stdin=None):
        return subprocess.run([CLI, "--address", address] + list(args),
                              input=stdin, capture_output=True, text=True,
                              timeout=60)
    return run


def test_generate_streams_text_and_prints_stats(cli):
    r = cli("generate", "def fibonacci(n):\n", "--max-tokens", "12", "--k",
            "2", "--stats", "--show-ids")
    assert r.returncode == 0, r.stderr
    err = dict(l.split(": ", 1) for l in r.stderr.splitlines() if ": " in l)
    ids = err["ids"].split(",")
    assert 12 <= len(ids) <= 14  # overshoot up to k
    assert err["finish"] == "LENGTH"
    assert "completion %d" % len(ids) in err["usage"]
    assert "spec" in err and "client" in err
    # stdout is exactly the text of those ids.
    d = cli("detokenize", err["ids"])
    assert d.returncode == 0 and d.stdout == r.stdout


def test_generate_from_ids_matches_text_input(cli):
    toks = cli("tokenize", "import os\n")
    assert toks.returncode == 0, toks.stderr
    ids = toks.stdout.strip()
    a = cli("generate", "import os\n", "--max-tokens", "8")
    b = cli("generate", "--ids", ids, "--max-tokens", "8")
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert a.stdout == b.stdout and a.stdout


def test_stop_string_is_not_returned(cli):
    r = cli("generate", "def f(x):\n", "--max-tokens", "40", "--stop", "\\n",
            "--stats")
    assert r.returncode == 0, r.stderr
    assert "\n" not in r.stdout and "finish: STOP" in r.stderr


def test_sessions_turns_rewind_and_close(cli):
    opened = cli("session", "open", "--capacity", "256")
    assert opened.returncode == 0, opened.stderr
    sid = opened.stdout.strip()
    first = cli("generate", "--session", sid, "class A:\n", "--max-tokens", "6")
    assert first.returncode == 0, first.stderr
    again = cli("generate", "--session", sid, "--rewind", "--max-tokens", "6")
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout  # greedy regenerate: same reply
    got = cli("session", "get", sid)
    assert got.returncode == 0 and sid in got.stdout
    assert "committed:" in got.stdout and "rewind_pos:" in got.stdout
    listed = cli("session", "list")
    assert listed.returncode == 0 and sid in listed.stdout
    assert cli("session", "close", sid).returncode == 0
    gone = cli("session", "get", sid)
    assert gone.returncode == 1
    assert "NOT_FOUND" in gone.stderr


def test_new_session_reports_its_id(cli):
    r = cli("generate", "--new-session", "x = 1\n", "--max-tokens", "3")
    assert r.returncode == 0, r.stderr
    sid = [l for l in r.stderr.splitlines() if l.startswith("session: ")][0][9:]
    assert cli("session", "close", sid).returncode == 0


def test_info_lists_workers_and_model(cli, cluster):
    r = cli("info")
    assert r.returncode == 0, r.stderr
    assert cluster["worker"].address in r.stdout
    assert "lllflllf" in r.stdout and "mtp head" in r.stdout


def test_abort_and_errors(cli):
    r = cli("abort", "--request-id", "no-such-request")
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr and \
        "no-such-request is not running" in r.stderr
    bad = cli("generate", "--ids", "1,2,999999", "--max-tokens", "2")
    assert bad.returncode == 1
    assert "INVALID_ARGUMENT" in bad.stderr and "vocabulary" in bad.stderr
    assert cli("frobnicate").returncode == 2
    down = subprocess.run([CLI, "--address", "127.0.0.1:1", "info"],
                          capture_output=True, text=True, timeout=60)
    assert down.returncode == 1 and "UNAVAILABLE" in down.stderr
