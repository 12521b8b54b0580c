"""Issue 48: n > 1 samples through the SMG gateway and the vLLM engine
protocol. One request with n = 4 gives 4 choices, each a sample with its own
seed stream: the same seed gives the same 4 again, sample 0 is what n = 1
gives for that seed, and another seed gives others. The prompt is prefilled
once and every sample forks it (cached prompt tokens)."""
import os

import pytest

import e2e_util as e2e
import gateway_util as gw
import specserve_procs as procs

MODEL = os.path.relpath(e2e.DEFAULT_MODEL, procs.REPO)
VLLM = "vllm.grpc.engine.VllmEngine/"


@pytest.fixture(scope="module")
def env():
    cluster = e2e.Cluster(n_workers=1, model=MODEL,
                          worker_extra=[e2e.SPEC_ALWAYS_PAYS],
                          scheduler_extra=["--prefix_cache_sessions=16"])
    smg = None
    try:
        smg = gw.Smg([cluster.scheduler.address])
        yield cluster, smg.openai()
    finally:
        if smg is not None:
            smg.stop()
        cluster.stop()


def chat(openai, n, seed):
    """The n choices' texts, sorted: SMG 1.13 numbers the choices in the
    order their samples end, not by the engine's index."""
    r = openai.chat.completions.create(
        model=gw.MODEL_ID, n=n, seed=seed, temperature=1.0, max_tokens=24,
        messages=[{"role": "user", "content": "Write a function."}])
    assert sorted(c.index for c in r.choices) == list(range(n))
    return sorted(c.message.content or "" for c in r.choices)


def test_n_samples_through_smg_are_reproducible_by_seed(env):
    _, openai = env
    first = chat(openai, 4, seed=7)
    assert len(set(first)) > 1, first  # 4 samples, not 4 copies
    assert chat(openai, 4, seed=7) == first
    assert chat(openai, 1, seed=7)[0] in first  # sample 0 is n = 1's
    assert chat(openai, 4, seed=8) != first


def engine_generate(cluster, n, seed, prompt, stream):
    c = cluster.client
    req = c.request(VLLM + "Generate", request_id="samples-%d-%d" % (n, seed),
                    stream=stream)
    req.tokenized.input_ids.extend(prompt)
    req.sampling_params.temperature = 0.9
    req.sampling_params.seed = seed
    req.sampling_params.max_tokens = 16
    req.sampling_params.ignore_eos = True
    req.sampling_params.n = n
    ids, completes = {}, {}
    for r in c.invoke(VLLM + "Generate", req, timeout=60):
        if r.HasField("chunk"):
            ids.setdefault(r.chunk.index, []).extend(r.chunk.token_ids)
        else:
            completes[r.complete.index] = r.complete
    assert sorted(completes) == list(range(n))
    return ids, completes


@pytest.mark.parametrize("stream", [True, False])
def test_engine_protocol_samples_carry_their_index(env, stream):
    cluster, _ = env
    prompt = e2e.prompt_ids(31, 300)
    ids, completes = engine_generate(cluster, 4, 5, prompt, stream)
    # A stream's ids come in its chunks; a whole answer's in its complete.
    outputs = [ids[i] if stream else list(completes[i].output_ids)
               for i in range(4)]
    assert all(len(o) == 16 for o in outputs)
    assert len({tuple(o) for o in outputs}) > 1
    # The prompt was prefilled once: every sample forked it.
    assert [completes[i].cached_tokens for i in range(4)] == [300] * 4
    one_ids, one = engine_generate(cluster, 1, 5, prompt, stream)
    assert (one_ids[0] if stream else list(one[0].output_ids)) == outputs[0]
