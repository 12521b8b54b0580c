"""The scheduler's Prometheus metrics (--metrics_port) as a client's requests
move them, with real processes (one worker on the default model, which has a
tokenizer): the active-session gauge falls back to 0 once the sessions are
idle; a prompt refused for the context is not counted as prompt tokens and an
admitted one is, once; the per-request time per output token is observed
once per request, inter-token latency once per delivery; every vllm: series
names the served model, as vLLM's do."""
import os

import grpc
import pytest

import e2e_util as u


@pytest.fixture(scope="module")
def cluster():
    c = u.Cluster(n_workers=1, worker_extra=[u.SPEC_ALWAYS_PAYS],
                  metrics=True)
    yield c
    c.stop()


def test_active_sessions_prompt_tokens_latencies_and_model_label(cluster):
    """Each metric counts what was served: sessions while they are active,
    prompt tokens of admitted prompts only, latencies per request and per
    delivery; and each vllm: series carries the model_name label."""
    c, proc = cluster.client, cluster.scheduler
    active = 'specserve_sessions{residency="active"}'
    # The active-session gauge goes back to 0 once the sessions are idle.
    st = u.Stream(c, {"token_ids": {"ids": u.prompt_ids(91, 8)},
                      "stopping": {"max_tokens": 3000, "ignore_eos": True}})
    st.wait_tokens(1)
    u.wait_until(lambda: u.scrape(proc).get(active, 0) >= 1, timeout=10,
                 what="an active session counted")
    st.cancel()
    st.join()
    u.wait_until(lambda: u.scrape(proc).get(active) == 0 and
                 u.metric(proc, "vllm:num_requests_running") == 0,
                 timeout=10, what="no active session once idle")

    # A prompt refused for the context is not counted as prompt tokens; an
    # admitted one is, once.
    before = u.metric(proc, "vllm:prompt_tokens_total")
    long_text = " ".join("w%d" % i for i in range(2500))
    assert len(c.call("specserve.v1.Tokenization/Tokenize", text=long_text,
                      parse_special=True).ids) > 4096
    r = u.generate(c, {"text": long_text, "stopping": {"max_tokens": 4}})
    assert r.code == grpc.StatusCode.INVALID_ARGUMENT, r
    assert u.metric(proc, "vllm:prompt_tokens_total") == before
    prompt = u.prompt_ids(92, 7)
    tpot = "vllm:time_per_output_token_seconds_count"
    itl = "vllm:inter_token_latency_seconds_count"
    per_request = "vllm:request_time_per_output_token_seconds_count"
    counts = {n: u.metric(proc, n) for n in (tpot, itl, per_request)}
    u.generate_ok(c, {"token_ids": {"ids": prompt},
                      "stopping": {"max_tokens": 40, "ignore_eos": True}})
    assert u.metric(proc, "vllm:prompt_tokens_total") == before + len(prompt)
    # The per-request mean is observed once per request; inter-token latency
    # (and vLLM's deprecated alias time_per_output_token) once per delivery.
    deltas = {n: u.metric(proc, n) - counts[n] for n in counts}
    assert deltas[per_request] == 1, deltas
    assert deltas[itl] >= 1 and deltas[tpot] == deltas[itl], deltas

    # Every vllm: series names the served model, as vLLM's do.
    model = os.path.basename(cluster.model.rstrip("/"))
    assert model == os.path.basename(
        c.call("specserve.v1.Admin/GetModelInfo").path.rstrip("/"))
    vllm = {k: v for k, v in u.scrape(proc).items() if k.startswith("vllm:")}
    assert vllm and all('model_name="%s"' % model in k for k in vllm), [
        k for k in vllm if 'model_name="%s"' % model not in k][:5]
