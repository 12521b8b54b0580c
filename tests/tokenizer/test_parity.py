"""Parity of the C++ tokenizer (//tools/tokenize:tokenize) with HF `tokenizers`.

  bazel build //tools/tokenize:tokenize && python3 -m pytest -q tests/tokenizer

The CLI is found through $TOKENIZE_BIN, else at bazel-bin/tools/tokenize/tokenize
under the repository root. For every committed test tokenizer and every line of the
parity corpus (corpus.parity_lines(): stdlib Python sources, license texts, multi-line
chunks with LF and CRLF, seeded random mixes of tricky characters, and
data/edge_cases.jsonl) it checks:
  - Encode ids == HF encode(line, add_special_tokens=False) ids;
  - the same with special-token parsing off (HF encode_special_tokens=True);
  - Decode(ids) == HF decode(ids), with and without skip_special, and == line wherever
    HF round-trips;
  - streaming detokenization, token by token, concatenates to the full decode and
    emits only valid UTF-8 (the CLI checks each piece), also for random id sequences
    that split multi-byte characters.
"""
import json
import os
import random
import subprocess
import sys

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from tokenizers import AddedToken, Tokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import corpus  # noqa: E402

# "default_model" is the tokenizer the default model (models/default) ships.
TOKENIZERS = ["default_model", "qwen2_style", "gpt2_style", "qwen35_pattern",
              "llama3_pattern", "qwen2_added"]

# qwen2_style plus non-special added tokens matched after NFC (normalized=true).
ADDED_NORMALIZED = [
    dict(content="cafe\u0301", normalized=True),
    dict(content="\u212bngstr\u00f6m", normalized=True, single_word=True),
    dict(content="<tool>", normalized=True, lstrip=True),
    dict(content="</tool>", normalized=False, rstrip=True),
]

# Variants made at test time from qwen2_style by swapping its Split regex: the
# patterns of other Qwen/Llama releases, to cover more of the regex engine.
DERIVED_PATTERNS = {
    "qwen35_pattern": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|"
                       r"\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "llama3_pattern": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                       r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
}
_DERIVED_DIR = None


def tokenize_bin():
    path = os.environ.get("TOKENIZE_BIN") or os.path.join(
        ROOT, "bazel-bin", "tools", "tokenize", "tokenize")
    if not os.access(path, os.X_OK):
        pytest.fail(f"tokenize CLI not found at {path}: run "
                    "`bazel build //tools/tokenize:tokenize` or set TOKENIZE_BIN")
    return path


def tokenizer_path(name):
    if name == "default_model":
        return os.path.join(ROOT, "models", "default", "tokenizer.json")
    if name in DERIVED_PATTERNS or name == "qwen2_added":
        return os.path.join(_DERIVED_DIR, name, "tokenizer.json")
    return os.path.join(HERE, "data", name, "tokenizer.json")


@pytest.fixture(scope="session", autouse=True)
def derived_tokenizers(tmp_path_factory):
    global _DERIVED_DIR
    _DERIVED_DIR = str(tmp_path_factory.mktemp("derived"))
    with open(tokenizer_path("qwen2_style"), encoding="utf-8") as f:
        base = json.load(f)
    for name, pattern in DERIVED_PATTERNS.items():
        base["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": pattern}
        os.makedirs(os.path.join(_DERIVED_DIR, name))
        with open(tokenizer_path(name), "w", encoding="utf-8") as f:
            json.dump(base, f, ensure_ascii=False)
    added = Tokenizer.from_file(tokenizer_path("qwen2_style"))
    added.add_tokens([AddedToken(**kw) for kw in ADDED_NORMALIZED])
    os.makedirs(os.path.join(_DERIVED_DIR, "qwen2_added"))
    added.save(tokenizer_path("qwen2_added"))


def run_cli(name, values, *flags):
    """Feeds JSON values to the CLI one per line; returns the parsed output lines."""
    stdin = "".join(json.dumps(v) + "\n" for v in values)
    proc = subprocess.run(
        [tokenize_bin(), f"--tokenizer={tokenizer_path(name)}", *flags],
        input=stdin.encode("utf-8"), capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr.decode("utf-8", "replace")
    out = proc.stdout.decode("utf-8").split("\n")
    assert out[-1] == ""
    out = [json.loads(l) for l in out[:-1]]
    assert len(out) == len(values)
    return out


def report(mismatches, total, what):
    detail = "\n".join(f"  input={inp!r}\n    cpp={got}\n    hf ={want}"
                       for inp, got, want in mismatches[:5])
    assert not mismatches, f"{len(mismatches)}/{total} {what} differ:\n{detail}"


@pytest.fixture(scope="module")
def lines():
    result = corpus.parity_lines()
    assert len(result) >= 10000
    return result


@pytest.fixture(scope="module", params=TOKENIZERS)
def case(request, lines):
    """(name, HF tokenizer, HF ids of every line, C++ ids of every line)."""
    name = request.param
    hf = Tokenizer.from_file(tokenizer_path(name))
    hf_ids = [e.ids for e in hf.encode_batch(lines, add_special_tokens=False)]
    cpp_ids = run_cli(name, lines)
    return name, hf, hf_ids, cpp_ids


def test_encode_matches_hf(case, lines):
    _, _, hf_ids, cpp_ids = case
    bad = [(l, c, h) for l, c, h in zip(lines, cpp_ids, hf_ids) if c != h]
    report(bad, len(lines), "encodings")


def test_post_processor_adds_nothing(case, lines):
    # Encode has no add_special_tokens switch: it must not matter for these files.
    _, hf, hf_ids, _ = case
    sample = lines[:2000]
    with_specials = [e.ids for e in hf.encode_batch(sample, add_special_tokens=True)]
    assert with_specials == hf_ids[:len(sample)]


def test_encode_without_special_parsing_matches_hf(case, lines):
    name, hf, _, _ = case
    sample = [l for l in lines if "<" in l or "[" in l]
    hf.encode_special_tokens = True
    try:
        hf_ids = [e.ids for e in hf.encode_batch(sample, add_special_tokens=False)]
    finally:
        hf.encode_special_tokens = False
    cpp_ids = run_cli(name, sample, "--parse_special=false")
    bad = [(l, c, h) for l, c, h in zip(sample, cpp_ids, hf_ids) if c != h]
    report(bad, len(sample), "encodings without special parsing")


@pytest.mark.parametrize("skip_special", [False, True])
def test_decode_matches_hf(case, lines, skip_special):
    name, hf, hf_ids, _ = case
    flags = ["--decode"] + (["--skip_special"] if skip_special else [])
    cpp_text = run_cli(name, hf_ids, *flags)
    hf_text = hf.decode_batch(hf_ids, skip_special_tokens=skip_special)
    bad = [(ids, c, h) for ids, c, h in zip(hf_ids, cpp_text, hf_text) if c != h]
    report(bad, len(hf_ids), "decodings")
    if not skip_special:
        roundtrip = [(l, c) for l, c, h in zip(lines, cpp_text, hf_text) if h == l]
        if name != "gpt2_style":  # gpt2_style adds a prefix space: no round trip
            assert len(roundtrip) > 0.8 * len(lines)  # NFC changes the rest
        bad = [(l, c, l) for l, c in roundtrip if c != l]
        report(bad, len(roundtrip), "round trips")


def random_id_sequences(hf, n=3000, seed=7):
    """Random ids, biased to tokens holding partial UTF-8 characters."""
    rng = random.Random(seed)
    vocab = hf.get_vocab(with_added_tokens=True)
    ids = sorted(vocab.values())
    partial = [i for t, i in sorted(vocab.items())
               if any(0x80 <= ord(ch) <= 0xFF or 0x100 <= ord(ch) <= 0x143 for ch in t)]
    out = []
    for _ in range(n):
        pool = partial if rng.random() < 0.7 else ids
        out.append([rng.choice(pool) for _ in range(rng.randint(0, 12))])
    return out


@pytest.mark.parametrize("source", ["corpus", "random"])
def test_streaming_detokenizer_matches_decode(case, source):
    name, hf, hf_ids, _ = case
    sequences = hf_ids if source == "corpus" else random_id_sequences(hf)
    pieces = run_cli(name, sequences, "--decode", "--stream")
    full = hf.decode_batch(sequences, skip_special_tokens=False)
    bad = [(ids, "".join(p), f) for ids, p, f in zip(sequences, pieces, full)
           if "".join(p) != f]
    report(bad, len(sequences), "streamed decodings")
    if source == "random":
        cpp_full = run_cli(name, sequences, "--decode")
        bad = [(ids, c, f) for ids, c, f in zip(sequences, cpp_full, full) if c != f]
        report(bad, len(sequences), "decodings of random ids")
