"""specserve behind the SMG gateway (issue 31): SMG speaks the vLLM engine
protocol (vllm.grpc.engine.VllmEngine) to two schedulers on one CPU worker
with the default model, and the official openai client talks to SMG.

Scheduler A runs gateway requests speculatively (--gateway_speculation,
the default), scheduler B plainly; SMG routes round robin, so each check
runs until both have served it and compares every answer with specserve.v1
Generate's for the same prompt ids (greedy).
"""
import io
import os
import threading
import time
import zipfile

import grpc
import pytest

import e2e_util as e2e
import gateway_util as gw
import specserve_procs as procs

# The worker and schedulers take the model by its path relative to the
# repository (their working folder), which SMG (in a temporary folder) cannot
# open: SMG must build its tokenizer from VllmEngine.GetTokenizer.
MODEL = os.path.relpath(e2e.DEFAULT_MODEL, procs.REPO)
VLLM = "vllm.grpc.engine.VllmEngine/"
CHAT_PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def env():
    cluster = e2e.Cluster(n_workers=1, model=MODEL, metrics=True,
                          worker_extra=[e2e.SPEC_ALWAYS_PAYS])
    smg = None
    try:
        plain = cluster.add_scheduler(
            [w.address for w in cluster.workers],
            ["--gateway_speculation=false"],
            metrics=True)
        spec = cluster.scheduler
        smg = gw.Smg([spec.address, plain.address])
        yield Env(cluster, spec, plain, smg)
    finally:
        if smg is not None:
            smg.stop()
        cluster.stop()


class Env:
    def __init__(self, cluster, spec, plain, smg):
        self.cluster = cluster
        self.spec = spec
        self.plain = plain
        self.smg = smg
        self.client = cluster.client  # specserve.v1 on scheduler A
        self.openai = smg.openai()

    def served(self):
        """Requests each scheduler has finished, (spec, plain)."""
        return tuple(e2e.metric(s, "vllm:request_success_total")
                     for s in (self.spec, self.plain))

    def on_both(self, check, tries=10):
        """Runs check() until each scheduler has served one call of it;
        returns {"spec": result, "plain": result}."""
        out = {}
        for _ in range(tries):
            before = self.served()
            result = check()
            e2e.wait_until(lambda: self.served() != before, timeout=10,
                           what="a scheduler counting the request")
            after = self.served()
            if after[0] > before[0]:
                out.setdefault("spec", result)
            if after[1] > before[1]:
                out.setdefault("plain", result)
            if len(out) == 2:
                return out
        raise AssertionError("round robin did not reach both schedulers: %r"
                             % out)


def tokenize(env, text):
    return list(env.client.call("specserve.v1.Tokenization/Tokenize",
                                text=text, parse_special=True).ids)


def detokenize(env, ids):
    return env.client.call("specserve.v1.Tokenization/Detokenize", ids=ids,
                           skip_special=True).text


def chat_prompt_ids(env, content):
    # models/default's ChatML chat template (tokenizer_config.json).
    return tokenize(env, "<|im_start|>user\n%s<|im_end|>\n"
                         "<|im_start|>assistant\n" % content)


def reference(env, prompt, max_tokens, stop=()):
    """specserve.v1 Generate's greedy ids and text for `prompt` ids, cut at
    max_tokens (a speculative round may commit more)."""
    r = e2e.generate_ok(env.client, {
        "token_ids": {"ids": prompt},
        "stopping": {"max_tokens": max_tokens, "stop": list(stop)},
        "response": {"ids": True, "text": True}})
    ids = list(r.ids)[:max_tokens]
    return ids, r.text if stop else detokenize(env, ids)


def test_smg_registers_specserve_and_serves_models(env):
    models = env.smg.get_json("/v1/models")["data"]
    assert [m["id"] for m in models] == [gw.MODEL_ID]
    workers = env.smg.workers()
    assert sorted(w["url"] for w in workers) == sorted(
        "grpc://" + s.address for s in (env.spec, env.plain))
    for w in workers:
        assert w["is_healthy"], w
        assert w["connection_mode"] == "grpc", w
        assert w["runtime_type"] == "vllm", w
    # Both services on the one port, listed by reflection.
    assert "vllm.grpc.engine.VllmEngine" in env.client.services()
    assert "specserve.v1.Generation" in env.client.services()


def test_chat_completion_matches_generate(env):
    prompt = chat_prompt_ids(env, CHAT_PROMPT)
    want_ids, want_text = reference(env, prompt, 12)

    def check():
        r = env.openai.chat.completions.create(
            model=gw.MODEL_ID, temperature=0, max_tokens=12,
            messages=[{"role": "user", "content": CHAT_PROMPT}])
        assert r.choices[0].message.content == want_text
        assert r.choices[0].finish_reason == "length"
        assert r.usage.prompt_tokens == len(prompt)
        assert r.usage.completion_tokens == len(want_ids) == 12
        cached = r.usage.prompt_tokens_details.cached_tokens
        assert 0 <= cached <= len(prompt)
        return r

    env.on_both(check)


def test_streaming_chat_completion_matches_generate(env):
    prompt = chat_prompt_ids(env, CHAT_PROMPT)
    want_ids, want_text = reference(env, prompt, 10)

    def check():
        text, finish, usage, chunks = "", None, None, 0
        for c in env.openai.chat.completions.create(
                model=gw.MODEL_ID, temperature=0, max_tokens=10, stream=True,
                stream_options={"include_usage": True},
                messages=[{"role": "user", "content": CHAT_PROMPT}]):
            if c.usage is not None:
                usage = c.usage
            for ch in c.choices:
                text += ch.delta.content or ""
                chunks += 1
                finish = ch.finish_reason or finish
        assert text == want_text
        assert finish == "length"
        assert chunks > 1
        assert usage.prompt_tokens == len(prompt)
        assert usage.completion_tokens == len(want_ids) == 10
        return text

    env.on_both(check)


def test_completion_matches_generate(env):
    text_prompt = "import os\nimport sys\n\ndef main("
    prompt = tokenize(env, text_prompt)
    want_ids, want_text = reference(env, prompt, 16)

    def check():
        r = env.openai.completions.create(model=gw.MODEL_ID,
                                          prompt=text_prompt, temperature=0,
                                          max_tokens=16)
        assert r.choices[0].text == want_text
        assert r.usage.prompt_tokens == len(prompt)
        assert r.usage.completion_tokens == 16
        return r

    env.on_both(check)


def test_stop_string_and_max_tokens(env):
    text_prompt = "def add(a, b):\n"
    prompt = tokenize(env, text_prompt)
    full_ids, full_text = reference(env, prompt, 24)
    assert "\n" in full_text.strip("\n"), full_text  # the stop occurs
    stop_ids, stop_text = reference(env, prompt, 24, stop=["\n"])
    assert "\n" not in stop_text and len(stop_ids) < 24

    def check():
        r = env.openai.completions.create(model=gw.MODEL_ID,
                                          prompt=text_prompt, temperature=0,
                                          max_tokens=24, stop=["\n"])
        assert r.choices[0].text == stop_text
        assert r.choices[0].finish_reason == "stop"
        short = env.openai.completions.create(
            model=gw.MODEL_ID, prompt=text_prompt, temperature=0,
            max_tokens=3)
        assert short.usage.completion_tokens == 3
        assert short.choices[0].text == detokenize(env, full_ids[:3])
        assert short.choices[0].finish_reason == "length"
        return r

    env.on_both(check, tries=12)


def test_speculation_on_one_scheduler_off_on_the_other(env):
    drafts = [e2e.metric(s, "vllm:spec_decode_num_drafts_total")
              for s in (env.spec, env.plain)]

    def check():
        return env.openai.completions.create(
            model=gw.MODEL_ID, prompt="class Node:\n", temperature=0,
            max_tokens=20)

    results = env.on_both(check)
    assert results["spec"].choices[0].text == results["plain"].choices[0].text
    after = [e2e.metric(s, "vllm:spec_decode_num_drafts_total")
             for s in (env.spec, env.plain)]
    assert after[0] > drafts[0], "scheduler A ran no speculative round"
    assert after[1] == drafts[1], "scheduler B speculated"


def test_client_disconnect_aborts_on_worker(env):
    tokens_before = sum(e2e.metric(s, "vllm:generation_tokens_total")
                        for s in (env.spec, env.plain))
    stream = env.openai.completions.create(
        model=gw.MODEL_ID, prompt="def", temperature=0, max_tokens=3000,
        stream=True, extra_body={"ignore_eos": True})
    got = 0
    for c in stream:
        got += 1
        if got >= 3:
            break
    stream.close()  # the HTTP client goes away mid-generation
    e2e.wait_until(lambda: env.cluster.worker_info(0).active_bursts == 0,
                   timeout=30, interval=0.05, what="the worker's burst ending")
    e2e.wait_until(lambda: all(
        e2e.metric(s, "vllm:num_requests_running") == 0
        for s in (env.spec, env.plain)), timeout=10,
        what="no request running")
    tokens = sum(e2e.metric(s, "vllm:generation_tokens_total")
                 for s in (env.spec, env.plain)) - tokens_before
    assert tokens < 3000, "the request ran to its end: %d tokens" % tokens


def test_abort_by_request_id(env):
    c = env.client
    req = c.request(VLLM + "Generate", request_id="gw-abort-1", stream=True)
    req.tokenized.input_ids.extend(tokenize(env, "def"))
    req.sampling_params.temperature = 0
    req.sampling_params.max_tokens = 3000
    req.sampling_params.ignore_eos = True
    responses = c.invoke(VLLM + "Generate", req, timeout=60)
    first = next(responses)
    assert first.HasField("chunk") and len(first.chunk.token_ids) > 0
    c.call(VLLM + "Abort", request_ids=["gw-abort-1", "never-ran"])
    rest = list(responses)
    complete = rest[-1].complete
    assert rest[-1].HasField("complete")
    assert complete.finish_reason == "abort"
    n = len(first.chunk.token_ids) + sum(len(r.chunk.token_ids)
                                         for r in rest[:-1])
    assert complete.completion_tokens == n < 3000


def test_non_streaming_generate_carries_every_id(env):
    c = env.client
    prompt = tokenize(env, "for i in range(")
    want, _ = reference(env, prompt, 9)
    req = c.request(VLLM + "Generate", request_id="gw-whole-1")
    req.tokenized.input_ids.extend(prompt)
    req.sampling_params.temperature = 0
    req.sampling_params.max_tokens = 9
    out = list(c.invoke(VLLM + "Generate", req, timeout=60))
    assert len(out) == 1 and out[0].HasField("complete")
    assert list(out[0].complete.output_ids) == want
    assert out[0].complete.finish_reason == "length"
    assert out[0].complete.prompt_tokens == len(prompt)
    assert out[0].complete.completion_tokens == 9


def test_logprobs_equal_with_and_without_speculation(env):
    prompt = chat_prompt_ids(env, CHAT_PROMPT)
    want_ids, want_text = reference(env, prompt, 8)

    def check():
        r = env.openai.chat.completions.create(
            model=gw.MODEL_ID, temperature=0, max_tokens=8, logprobs=True,
            top_logprobs=2,
            messages=[{"role": "user", "content": CHAT_PROMPT}])
        assert r.choices[0].message.content == want_text
        content = r.choices[0].logprobs.content
        assert len(content) == len(want_ids) == 8
        for t in content:
            assert len(t.top_logprobs) == 2
            # Greedy: the chosen token is the most likely one (T = 1).
            assert t.logprob == t.top_logprobs[0].logprob
            assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
            assert t.logprob <= 0
        return [(t.token, t.logprob, [(a.token, a.logprob)
                                      for a in t.top_logprobs])
                for t in content]

    results = env.on_both(check)
    assert results["spec"] == results["plain"]


def test_prompt_logprobs_on_the_engine_protocol(env):
    c = env.client
    prompt = tokenize(env, "def main():\n    return")
    req = c.request(VLLM + "Generate", request_id="gw-prompt-lp")
    req.tokenized.input_ids.extend(prompt)
    req.sampling_params.temperature = 0
    req.sampling_params.max_tokens = 4
    req.sampling_params.logprobs = 1
    req.sampling_params.prompt_logprobs = 3
    out = list(c.invoke(VLLM + "Generate", req, timeout=60))
    complete = out[-1].complete
    lp = complete.input_logprobs
    assert list(lp.token_ids) == prompt
    assert not lp.token_logprobs[0].HasField("value")
    assert all(v.HasField("value") and v.value <= 0
               for v in lp.token_logprobs[1:])
    assert [len(t.values) for t in lp.top_logprobs] == [0] + [3] * (
        len(prompt) - 1)
    o = complete.output_logprobs
    assert list(o.token_ids) == list(complete.output_ids)
    assert len(o.token_logprobs) == len(o.top_logprobs) == 4


def reference_with(env, prompt, max_tokens, sampling=None, stopping=None):
    """specserve.v1 Generate's greedy ids for `prompt` ids with the logit
    controls in `sampling` / `stopping`, cut at max_tokens."""
    r = e2e.generate_ok(env.client, {
        "token_ids": {"ids": prompt},
        "sampling": dict(sampling or {}),
        "stopping": dict({"max_tokens": max_tokens}, **(stopping or {})),
        "response": {"ids": True}})
    return list(r.ids)[:max_tokens], r.final


def test_penalties_through_smg_match_generate(env):
    """frequency / presence / repetition penalties reach the engine through
    SMG's chat completions, change the output, and give specserve.v1's
    tokens with speculation on (scheduler A) and off (B)."""
    prompt = chat_prompt_ids(env, CHAT_PROMPT)
    plain_ids, _ = reference(env, prompt, 16)
    for controls in ({"frequency_penalty": 1.5, "presence_penalty": 0.5},
                     {"repetition_penalty": 1.8}):
        want, _ = reference_with(env, prompt, 16, sampling=controls)
        assert want != plain_ids, controls

        def check():
            r = env.openai.chat.completions.create(
                model=gw.MODEL_ID, temperature=0, max_tokens=16,
                messages=[{"role": "user", "content": CHAT_PROMPT}],
                **({k: v for k, v in controls.items()
                    if k != "repetition_penalty"}),
                extra_body={k: v for k, v in controls.items()
                            if k == "repetition_penalty"})
            assert r.choices[0].message.content == detokenize(env, want)
            assert r.usage.completion_tokens == 16
            return r.choices[0].message.content

        results = env.on_both(check)
        assert results["spec"] == results["plain"]


def test_min_tokens_and_stop_token_ids_through_smg(env):
    """Completions with stop_token_ids stop at the id (finish "stop", SMG's
    matched_stop names it, the id counted but not in the text, as vLLM's);
    min_tokens holds it back."""
    text_prompt = "import os\nimport sys\n"
    prompt = tokenize(env, text_prompt)
    newline = tokenize(env, "\n")[0]
    free, _ = reference(env, prompt, 12)
    at = free.index(newline)
    later, _ = reference_with(env, prompt, 12,
                              stopping={"stop_token_ids": [newline],
                                        "min_tokens": at + 2})
    assert len(later) >= at + 2 and newline not in later[:at + 2]
    assert later[:at] == free[:at]

    def check():
        r = env.openai.completions.create(
            model=gw.MODEL_ID, prompt=text_prompt, temperature=0,
            max_tokens=12, extra_body={"stop_token_ids": [newline]})
        choice = r.choices[0]
        assert choice.text == detokenize(env, free[:at])
        assert choice.finish_reason == "stop"
        assert choice.model_extra["matched_stop"] == newline
        assert r.usage.completion_tokens == at + 1
        held = env.openai.completions.create(
            model=gw.MODEL_ID, prompt=text_prompt, temperature=0,
            max_tokens=12, extra_body={"stop_token_ids": [newline],
                                       "min_tokens": at + 2})
        end = later.index(newline) if newline in later else len(later)
        assert held.choices[0].text == detokenize(env, later[:end])
        return choice.text, held.choices[0].text

    env.on_both(check)


def test_stop_string_is_matched_stop_through_smg(env):
    def check():
        r = env.openai.completions.create(
            model=gw.MODEL_ID, prompt="import os\nimport sys\n",
            temperature=0, max_tokens=12, stop=["time"])
        assert r.choices[0].finish_reason == "stop"
        assert r.choices[0].model_extra["matched_stop"] == "time"
        return r.choices[0].text

    env.on_both(check)


def _engine_generate(client, prompt, max_tokens, stream=False, build=None):
    req = client.request(VLLM + "Generate", request_id="gw-controls",
                         stream=stream)
    req.tokenized.input_ids.extend(prompt)
    req.sampling_params.temperature = 0
    req.sampling_params.max_tokens = max_tokens
    if build:
        build(req.sampling_params)
    return list(client.invoke(VLLM + "Generate", req, timeout=60))


def test_logit_bias_and_matched_stop_on_the_engine_protocol(env):
    """logit_bias (which SMG 1.13's OpenAI front end does not forward) on
    the engine protocol itself: a token biased by -100 never appears, with
    and without speculation. The stop token that ends the output is its
    last id, named by matched_token_id, streaming or not."""
    clients = (env.client, env.cluster.client_for(env.plain))
    prompt = tokenize(env, "import os\nimport sys\n")
    outs = []
    for c in clients:
        free = list(_engine_generate(c, prompt, 24)[-1].complete.output_ids)
        banned = max(set(free), key=free.count)
        out = _engine_generate(
            c, prompt, 24,
            build=lambda p: p.logit_bias.__setitem__(banned, -100.0))
        ids = list(out[-1].complete.output_ids)
        assert len(ids) == 24 and banned not in ids, (banned, ids)
        outs.append(ids)
    assert outs[0] == outs[1]

    newline = tokenize(env, "\n")[0]
    free, _ = reference(env, prompt, 12)
    at = free.index(newline)
    for c in clients:
        for stream in (False, True):
            out = _engine_generate(
                c, prompt, 12, stream=stream,
                build=lambda p: p.stop_token_ids.append(newline))
            complete = out[-1].complete
            ids = (list(complete.output_ids) if not stream else
                   [i for r in out[:-1] for i in r.chunk.token_ids])
            assert ids == free[:at + 1], (stream, ids)
            assert complete.finish_reason == "stop"
            assert complete.WhichOneof("matched_stop") == "matched_token_id"
            assert complete.matched_token_id == newline
            assert complete.completion_tokens == at + 1


# Refused through SMG: (request fields, HTTP status SMG answers, the field
# the message names). The engine answers INVALID_ARGUMENT (SMG: 400) or
# UNIMPLEMENTED (SMG: 501).
SMG_REFUSALS = [
    ({"frequency_penalty": 2.5}, 400, "frequency_penalty"),
]


@pytest.mark.parametrize("fields,status,field", SMG_REFUSALS)
def test_unsupported_field_refused_through_smg(env, fields, status, field):
    body = {"model": gw.MODEL_ID, "max_tokens": 3, "temperature": 0,
            "messages": [{"role": "user", "content": "hi"}]}
    body.update(fields)
    code, answer = env.smg.post("/v1/chat/completions", body)
    assert code == status, answer
    assert field in answer["error"]["message"], answer


def _refusal(env, build):
    c = env.client
    req = c.request(VLLM + "Generate", request_id="gw-refused")
    req.tokenized.input_ids.extend([100, 200, 300])
    req.sampling_params.max_tokens = 4
    build(req)
    return e2e.rpc_code(lambda: list(c.invoke(VLLM + "Generate", req,
                                              timeout=30)))


# Values SMG's OpenAI front end does not pass on (it checks the penalties'
# ranges itself), refused when they reach the engine protocol directly.
GRPC_REFUSALS = [
    (lambda r: setattr(r.sampling_params, "min_tokens", 5),
     grpc.StatusCode.INVALID_ARGUMENT, "sampling_params.min_tokens"),
    (lambda r: r.sampling_params.logit_bias.__setitem__(10 ** 7, 1.0),
     grpc.StatusCode.INVALID_ARGUMENT, "sampling_params.logit_bias"),
    (lambda r: r.sampling_params.logit_bias.__setitem__(-1, 1.0),
     grpc.StatusCode.INVALID_ARGUMENT, "sampling_params.logit_bias"),
    (lambda r: r.sampling_params.logit_bias.__setitem__(5, 101.0),
     grpc.StatusCode.INVALID_ARGUMENT, "sampling_params.logit_bias"),
    (lambda r: setattr(r.sampling_params, "presence_penalty", 2.5),
     grpc.StatusCode.INVALID_ARGUMENT, "sampling_params.presence_penalty"),
    (lambda r: setattr(r.sampling_params, "frequency_penalty", -3.0),
     grpc.StatusCode.INVALID_ARGUMENT, "sampling_params.frequency_penalty"),
    (lambda r: setattr(r.sampling_params, "repetition_penalty", -1.0),
     grpc.StatusCode.INVALID_ARGUMENT, "sampling_params.repetition_penalty"),
    (lambda r: setattr(r.sampling_params, "logprobs", -1),
     grpc.StatusCode.INVALID_ARGUMENT, "sampling_params.logprobs"),
    (lambda r: setattr(r.sampling_params, "prompt_logprobs", 21),
     grpc.StatusCode.INVALID_ARGUMENT, "sampling_params.prompt_logprobs"),
    (lambda r: setattr(r.sampling_params, "max_tokens", 0),
     grpc.StatusCode.INVALID_ARGUMENT, "sampling_params.max_tokens"),
    (lambda r: setattr(r, "data_parallel_rank", 1),
     grpc.StatusCode.INVALID_ARGUMENT, "data_parallel_rank"),
    (lambda r: r.mm_inputs.mm_hashes.append("x"),
     grpc.StatusCode.UNIMPLEMENTED, "mm_inputs"),
    (lambda r: setattr(r, "kv_transfer_params_json", "{}"),
     grpc.StatusCode.UNIMPLEMENTED, "kv_transfer_params_json"),
    (lambda r: setattr(r.sampling_params, "structural_tag", "{}"),
     grpc.StatusCode.UNIMPLEMENTED, "sampling_params.structural_tag"),
    (lambda r: setattr(r.sampling_params, "n", 17),
     grpc.StatusCode.INVALID_ARGUMENT, "sampling_params.n"),
]


@pytest.mark.parametrize("build,code,field", GRPC_REFUSALS)
def test_unsupported_field_refused_on_grpc(env, build, code, field):
    got, details = _refusal(env, build)
    assert got == code, details
    assert details.startswith(field + ":"), details


def test_unprovided_rpcs_are_unimplemented(env):
    c = env.client
    for method in ("Embed", "FlushCache", "StartProfile", "StopProfile",
                   "SubscribeKvEvents"):
        code, details = e2e.rpc_code(lambda: c.call(VLLM + method))
        assert code == grpc.StatusCode.UNIMPLEMENTED, method
        assert details.startswith(method + ":"), details


def test_info_rpcs(env):
    c = env.client
    health = c.call(VLLM + "HealthCheck")
    assert health.healthy
    info = c.call(VLLM + "GetModelInfo")
    model = c.call("specserve.v1.Admin/GetModelInfo")
    assert info.served_model_name == gw.MODEL_ID
    assert info.max_context_length == model.max_context
    assert info.vocab_size == model.vocab_size
    assert list(info.architectures) == [model.architecture]
    assert set(info.eos_token_ids) == set(e2e.eos_ids(e2e.DEFAULT_MODEL))
    server = c.call(VLLM + "GetServerInfo")
    assert server.data_parallel_size == 1 and not server.is_paused
    loads = c.call(VLLM + "GetLoads")
    assert loads.dp_rank_count == 1 and len(loads.loads) == 1
    assert loads.loads[0].num_running_reqs == 0
    assert 0 < loads.loads[0].token_usage < 1 or \
        loads.loads[0].token_usage == 0
    chunks = c.call(VLLM + "GetTokenizer")
    assert all(not ch.sha256 for ch in chunks[:-1]) and chunks[-1].sha256
    data = b"".join(ch.data for ch in chunks)
    import hashlib
    assert hashlib.sha256(data).hexdigest() == chunks[-1].sha256
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        assert z.testzip() is None
        for name in ("tokenizer.json", "tokenizer_config.json",
                     "config.json"):
            with open(os.path.join(e2e.DEFAULT_MODEL, name), "rb") as f:
                assert z.read(name) == f.read(), name


def test_busy_scheduler_reports_its_load(env):
    c = env.client
    req = c.request(VLLM + "Generate", request_id="gw-load-1", stream=True)
    req.tokenized.input_ids.extend(tokenize(env, "def"))
    req.sampling_params.temperature = 0
    req.sampling_params.max_tokens = 3000
    req.sampling_params.ignore_eos = True
    responses = c.invoke(VLLM + "Generate", req, timeout=60)
    next(responses)
    try:
        load = c.call(VLLM + "GetLoads").loads[0]
        assert load.num_running_reqs == 1 and load.num_total_reqs == 1
        # The session's memory, as the worker's next health poll reports it.
        e2e.wait_until(
            lambda: c.call(VLLM + "GetLoads").loads[0].token_usage > 0,
            timeout=5, what="the running session's memory in token_usage")
        assert c.call(VLLM + "GetServerInfo").active_requests == 1
    finally:
        responses.cancel()


def test_auth_applies_to_the_engine_protocol(env, tmp_path):
    token = "t" * 32
    tokens = tmp_path / "tokens"
    tokens.write_text("%s tenant-a user\n" % token)
    s = procs.start_scheduler([w.address for w in env.cluster.workers],
                              model=MODEL,
                              extra=["--auth_tokens=%s" % tokens])
    channel = grpc.insecure_channel(s.address)
    try:
        with_token = env.cluster.client_for(s, token=token)

        def anonymous(method, **fields):
            """Calls `method` with no token (reflection needs one, so the
            messages come from the token's client)."""
            m = with_token.method(VLLM + method)
            return channel.unary_unary(
                "/" + VLLM + method,
                request_serializer=lambda r: r.SerializeToString(),
                response_deserializer=with_token.message_class(
                    m.output_type).FromString)(
                with_token.request(VLLM + method, **fields), timeout=10)

        # HealthCheck, like grpc.health.v1, needs no token.
        e2e.wait_until(lambda: anonymous("HealthCheck").healthy, timeout=20,
                       what="the scheduler's worker available")
        for method, fields in (("GetModelInfo", {}), ("GetLoads", {}),
                               ("Abort", {"request_ids": ["x"]})):
            code, details = e2e.rpc_code(lambda: anonymous(method, **fields))
            assert code == grpc.StatusCode.UNAUTHENTICATED, (method, details)
        assert with_token.call(VLLM + "GetModelInfo").vocab_size > 0
    finally:
        channel.close()
        s.stop()


def test_killing_one_scheduler_leaves_the_other_serving(env):
    env.plain.stop()
    e2e.wait_until(lambda: [w["is_healthy"] for w in env.smg.workers()
                            if w["url"] == "grpc://" + env.plain.address]
                   in ([False], []), timeout=30, interval=0.2,
                   what="SMG noticing the killed scheduler")
    served = lambda: e2e.metric(env.spec, "vllm:request_success_total")
    before = served()
    for _ in range(4):
        r = env.openai.completions.create(model=gw.MODEL_ID, prompt="x = ",
                                          temperature=0, max_tokens=4)
        assert r.usage.completion_tokens == 4
    e2e.wait_until(lambda: served() >= before + 4, timeout=10,
                   what="scheduler A serving every request")
