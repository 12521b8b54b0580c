"""Issue 48: structured output end to end. The official openai client talks to
the SMG gateway, which speaks the vLLM engine protocol to a specserve
scheduler on one CPU worker with the default model. Two gateways: one in
front of a scheduler that runs gateway requests speculatively, one in front
of a scheduler that runs them plainly, so every request runs both ways.

- 20 JSON schemas of different kinds (nested objects, enums, arrays, bounded
  numbers, required and optional fields): every output parses and validates
  against its schema (jsonschema), greedy and sampled; greedy, speculative
  and plain give the same text.
- A regex and an EBNF grammar hold through SMG (top-level `regex` / `ebnf`,
  the names SMG 1.13 maps); a choice through the vLLM engine protocol (SMG
  1.13 drops it); all of them, and JSON, through specserve.v1 Generate,
  where the ids are compared with speculation on and off.
- A tool call: SMG turns `tools` with a forced tool_choice into a JSON
  schema constraint; the arguments parse and validate.
- Bad grammars: INVALID_ARGUMENT with the parser's message, and the session
  still works.
"""
import json
import os
import re

import grpc
import jsonschema
import pytest

import e2e_util as e2e
import gateway_util as gw
import specserve_procs as procs

MODEL = os.path.relpath(e2e.DEFAULT_MODEL, procs.REPO)
PROMPT = "Answer in JSON."


def _obj(props, required=None, **extra):
    s = {"type": "object", "properties": props, "additionalProperties": False,
         "required": list(props) if required is None else required}
    s.update(extra)
    return s


STR8 = {"type": "string", "maxLength": 8}
SCHEMAS = [
    {"type": "boolean"},
    {"type": "integer", "minimum": -5, "maximum": 40},
    {"enum": ["north", "south", "east", "west"]},
    {"type": "string", "maxLength": 12},
    {"type": "string", "pattern": "^[a-z]{2,6}$"},
    _obj({"ok": {"type": "boolean"}}),
    _obj({"name": STR8, "age": {"type": "integer", "minimum": 0,
                                "maximum": 120}}),
    _obj({"color": {"enum": ["red", "green", "blue"]},
          "shade": {"type": "integer", "minimum": 0, "maximum": 9}}),
    _obj({"id": {"type": "integer", "minimum": 1, "maximum": 999},
          "note": STR8}, required=["id"]),
    _obj({"a": {"type": "boolean"}, "b": {"type": "boolean"},
          "c": {"type": "boolean"}}, required=["b"]),
    _obj({"point": _obj({"x": {"type": "integer", "minimum": -9,
                               "maximum": 9},
                         "y": {"type": "integer", "minimum": -9,
                               "maximum": 9}})}),
    _obj({"user": _obj({"name": STR8,
                        "tags": {"type": "array", "items": STR8,
                                 "maxItems": 2}})}),
    {"type": "array", "items": {"type": "integer", "minimum": 0,
                                "maximum": 9}, "minItems": 1, "maxItems": 4},
    {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 3},
    {"type": "array", "items": _obj({"k": STR8, "v": {"type": "boolean"}}),
     "minItems": 1, "maxItems": 2},
    _obj({"kind": {"const": "point"},
          "coords": {"type": "array", "items": {"type": "integer",
                                                "minimum": 0, "maximum": 99},
                     "minItems": 2, "maxItems": 2}}),
    _obj({"status": {"enum": ["ok", "error"]},
          "code": {"type": "integer", "minimum": 100, "maximum": 599},
          "detail": {"anyOf": [STR8, {"type": "null"}]}},
         required=["status", "code"]),
    _obj({"value": {"anyOf": [{"type": "integer", "minimum": 0,
                               "maximum": 50}, {"type": "boolean"}]}}),
    _obj({"items": {"type": "array", "items": _obj(
        {"sku": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"},
         "qty": {"type": "integer", "minimum": 1, "maximum": 5}}),
        "maxItems": 2}, "paid": {"type": "boolean"}}),
    _obj({"meta": _obj({"version": {"type": "integer", "minimum": 1,
                                    "maximum": 3},
                        "flags": _obj({"beta": {"type": "boolean"}},
                                      required=[])}),
          "name": STR8}, required=["meta"]),
]
assert len(SCHEMAS) == 20
# Enough for any of the schemas above with the JSON whitespace bound.
MAX_TOKENS = 400
SAMPLED = dict(temperature=0.8, seed=1234)


@pytest.fixture(scope="module")
def env():
    # The default model is small and loops on whitespace where a grammar
    # allows it: JSON without free whitespace keeps its outputs short.
    cluster = e2e.Cluster(n_workers=1, model=MODEL,
                          worker_extra=[e2e.SPEC_ALWAYS_PAYS,
                                        "--json_whitespace=0"])
    gateways = []
    try:
        plain = cluster.add_scheduler([w.address for w in cluster.workers],
                                      ["--gateway_speculation=false"])
        gateways.append(gw.Smg([cluster.scheduler.address]))
        gateways.append(gw.Smg([plain.address]))
        yield Env(cluster, plain, gateways[0].openai(), gateways[1].openai())
    finally:
        for g in gateways:
            g.stop()
        cluster.stop()


class Env:
    def __init__(self, cluster, plain, spec_openai, plain_openai):
        self.cluster = cluster
        self.client = cluster.client
        self.plain = plain
        self.spec_openai = spec_openai
        self.plain_openai = plain_openai


def chat(client, response_format=None, **kw):
    args = dict(model=gw.MODEL_ID, max_tokens=MAX_TOKENS,
                messages=[{"role": "user", "content": PROMPT}])
    if response_format is not None:
        args["response_format"] = response_format
    args.update(kw)
    return client.chat.completions.create(**args)


def schema_format(i, schema):
    return {"type": "json_schema",
            "json_schema": {"name": "s%d" % i, "schema": schema,
                            "strict": True}}


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_json_schema_outputs_validate_and_spec_equals_plain(env, i):
    schema = SCHEMAS[i]
    fmt = schema_format(i, schema)
    greedy = {}
    for name, client in (("spec", env.spec_openai),
                         ("plain", env.plain_openai)):
        r = chat(client, fmt, temperature=0)
        choice = r.choices[0]
        assert choice.finish_reason == "stop", (name, choice)
        value = json.loads(choice.message.content)
        jsonschema.validate(value, schema)
        greedy[name] = choice.message.content
    assert greedy["spec"] == greedy["plain"]
    r = chat(env.spec_openai, fmt, **SAMPLED)
    assert r.choices[0].finish_reason == "stop", r.choices[0]
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


def completion(client, prompt="x =", **extra_body):
    return client.completions.create(model=gw.MODEL_ID, prompt=prompt,
                                     max_tokens=64, temperature=0,
                                     extra_body=extra_body)


REGEX = r"(yes|no), [0-9]{1,3}\."
EBNF = 'root ::= "(" [a-z]+ ("," [a-z]+)* ")"'
CHOICES = ["red", "green", "blue sky"]
VLLM = "vllm.grpc.engine.VllmEngine/"


def test_regex_and_ebnf_through_smg(env):
    # SMG 1.13 takes them as top-level request fields (SGLang's names).
    texts = {}
    for name, client in (("spec", env.spec_openai),
                         ("plain", env.plain_openai)):
        r = completion(client, regex=REGEX)
        assert r.choices[0].finish_reason == "stop", r.choices[0]
        assert re.fullmatch(REGEX, r.choices[0].text), r.choices[0]
        e = completion(client, ebnf=EBNF)
        assert e.choices[0].finish_reason == "stop", e.choices[0]
        assert re.fullmatch(r"\([a-z]+(,[a-z]+)*\)", e.choices[0].text), \
            e.choices[0]
        texts[name] = (r.choices[0].text, e.choices[0].text)
    assert texts["spec"] == texts["plain"]


def test_choice_through_the_engine_protocol(env):
    # SMG 1.13 passes no choice on (it drops `choice` / `guided_choice`);
    # the vLLM engine protocol carries it (SamplingParams.choice).
    c = env.client
    for seed in range(4):
        req = c.request(VLLM + "Generate", request_id="choice-%d" % seed)
        req.tokenized.input_ids.extend(e2e.prompt_ids(seed, 8))
        req.sampling_params.temperature = 0.9
        req.sampling_params.seed = seed
        req.sampling_params.max_tokens = 16
        req.sampling_params.choice.choices.extend(CHOICES)
        out = list(c.invoke(VLLM + "Generate", req, timeout=60))
        complete = out[-1].complete
        assert complete.finish_reason == "stop", complete
        ids = [i for i in complete.output_ids if i not in e2e.eos_ids()]
        text = c.call("specserve.v1.Tokenization/Detokenize", ids=ids,
                      skip_special=True).text
        assert text in CHOICES, text


def generate(env, k, structured_output, prompt=None, sampling=None, **extra):
    req = {"token_ids": {"ids": prompt or e2e.prompt_ids(5, 10)},
           "sampling": dict(sampling or {}),
           "stopping": {"max_tokens": 120},
           "speculation": {"enable": k > 0, "k": k},
           "response": {"ids": True, "text": True, "spec_stats": True,
                        "include_stop_token": True},
           "structured_output": structured_output}
    req.update(extra)
    return e2e.generate_ok(env.client, req)


@pytest.mark.parametrize("constraint", [
    {"regex": REGEX}, {"ebnf": EBNF}, {"choice": {"values": CHOICES}},
    {"json_schema": json.dumps(SCHEMAS[16])}, {"json_object": True}])
def test_generate_ids_are_the_same_with_and_without_speculation(env,
                                                                constraint):
    plain = generate(env, 0, constraint)
    assert e2e.finish_name(plain) == "STOP", plain
    if "json_object" in constraint:
        assert isinstance(json.loads(plain.text), dict), plain.text
    elif "json_schema" in constraint:
        jsonschema.validate(json.loads(plain.text), SCHEMAS[16])
    for k in (1, 3, 5):
        spec = generate(env, k, constraint)
        assert spec.final.spec_stats.rounds > 0
        assert spec.ids == plain.ids, (constraint, k)
    sampled = dict(temperature=0.9, seed=77)
    want = generate(env, 0, constraint, sampling=sampled).ids
    assert generate(env, 3, constraint, sampling=sampled).ids == want


def test_tool_call_arguments_follow_the_function_schema(env):
    params = _obj({"city": STR8,
                   "unit": {"enum": ["celsius", "fahrenheit"]}})
    tools = [{"type": "function",
              "function": {"name": "get_weather", "description": "Weather",
                           "parameters": params}}]
    for choice in ({"type": "function", "function": {"name": "get_weather"}},
                   "required"):
        r = env.spec_openai.chat.completions.create(
            model=gw.MODEL_ID, max_tokens=MAX_TOKENS, temperature=0,
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=tools, tool_choice=choice)
        calls = r.choices[0].message.tool_calls
        assert calls, (choice, r.choices[0])
        assert calls[0].function.name == "get_weather"
        jsonschema.validate(json.loads(calls[0].function.arguments), params)


@pytest.mark.parametrize("bad,words", [
    ({"json_schema": "{\"type\": "}, "json_schema"),
    ({"json_schema": json.dumps({"type": "no-such-type"})}, "json_schema"),
    ({"regex": "(unclosed"}, "regex"),
    ({"ebnf": "root ::= undefined_rule"}, "ebnf"),
    ({"choice": {"values": []}}, "choice"),
    ({"regex": "a" * (64 * 1024 + 1)}, "over the limit"),
])
def test_bad_grammars_are_invalid_argument_and_the_session_works(env, bad,
                                                                  words):
    c = env.client
    sid = c.call("specserve.v1.Sessions/OpenSession",
                 capacity=512).session_id
    first_prompt, prompt = e2e.prompt_ids(8, 6), e2e.prompt_ids(9, 8)
    session = {"session": {"session_id": sid}}
    first = generate(env, 2, {"choice": {"values": CHOICES}},
                     prompt=first_prompt, **session)
    r = e2e.generate(c, {"token_ids": {"ids": prompt},
                         "stopping": {"max_tokens": 8},
                         "structured_output": bad, **session})
    assert r.code == grpc.StatusCode.INVALID_ARGUMENT, r
    assert words in r.details, r.details
    # The refused turn left nothing: the next turn continues from the first.
    good = generate(env, 2, {"regex": REGEX}, prompt=prompt, **session)
    assert re.fullmatch(REGEX, good.text), good.text
    want = generate(env, 0, {"regex": REGEX},
                    prompt=first_prompt + list(first.ids) + prompt)
    assert good.ids == want.ids
    c.call("specserve.v1.Sessions/CloseSession", session_id=sid)
