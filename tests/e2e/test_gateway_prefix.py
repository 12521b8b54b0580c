"""Prefix reuse behind the SMG gateway (issue 32, acceptance 2): a chat client
resends the whole conversation every turn; from turn 2 on each request
resumes from the previous turn's state, so its cached tokens cover at least
95% of the previous turn's prompt and reply (exactness of resumed requests:
tests/e2e/test_prefix_reuse.py). Turn times are printed (the CPU figures of
the note), not asserted."""
import time

import pytest

import e2e_util as e2e
import gateway_util as gw

MODEL = e2e.DEFAULT_MODEL
TURNS = 10


@pytest.fixture(scope="module")
def env():
    cluster = e2e.Cluster(n_workers=1, model=MODEL, metrics=True,
                          scheduler_extra=["--prefix_cache_sessions=64",
                                           "--gateway_speculation=false"])
    smg = None
    try:
        smg = gw.Smg([cluster.scheduler.address])
        yield cluster, smg
    finally:
        if smg is not None:
            smg.stop()
        cluster.stop()


def _system_prompt(client, want_tokens=1500):
    line = "# helper %d: returns the sum of a list of numbers, or 0 for an empty list\n"
    text, i = "", 0
    while True:
        text += line % i
        i += 1
        n = len(client.call("specserve.v1.Tokenization/Tokenize", text=text,
                            parse_special=True).ids)
        if n >= want_tokens:
            return text, n


def test_ten_turn_chat_resumes_each_turn_from_the_last(env):
    cluster, smg = env
    c = cluster.client
    system, system_tokens = _system_prompt(c)
    assert system_tokens >= 1500
    openai = smg.openai()
    messages = [{"role": "system", "content": system}]
    previous_total = None
    times = []
    for turn in range(1, TURNS + 1):
        messages.append({"role": "user",
                         "content": "question %d: what does helper %d do?"
                                    % (turn, turn)})
        hits_before = e2e.metric(cluster.scheduler,
                                 "specserve_prefix_hit_tokens_total")
        t0 = time.monotonic()
        r = openai.chat.completions.create(
            model=gw.MODEL_ID, messages=messages, max_tokens=8,
            temperature=0)
        times.append(time.monotonic() - t0)
        reply = r.choices[0].message.content
        usage = r.usage
        hit_tokens = e2e.metric(cluster.scheduler,
                                "specserve_prefix_hit_tokens_total") - hits_before
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", None) if details else None
        if cached is not None:
            assert cached == hit_tokens, (cached, hit_tokens)
        if previous_total is not None:
            assert hit_tokens >= 0.95 * previous_total, (
                turn, hit_tokens, previous_total)
        previous_total = usage.prompt_tokens + usage.completion_tokens
        messages.append({"role": "assistant", "content": reply})
    print("turn seconds (CPU, %d-token system prompt): %s; turn 10 / turn 2 = "
          "%.2f" % (system_tokens, ", ".join("%.3f" % t for t in times),
                    times[9] / times[1]))
