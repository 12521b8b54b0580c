"""Deterministic text corpora built from files every Debian 12 machine with python3 has.

Used by train_tokenizers.py (training text, run once; outputs are committed) and by
test_parity.py / the benchmark (parity and throughput text, rebuilt at test time so
nothing large is committed). Every function returns the same lines on every run of one
machine: files are visited in sorted order and sampling uses a fixed seed.
"""
import glob
import os
import random
import sysconfig

_EDGE_CASES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                           "edge_cases.jsonl")


def stdlib_dir():
    """The Python 3.11 standard library: Debian's copy, else the running Python's."""
    if os.path.isdir("/usr/lib/python3.11"):
        return "/usr/lib/python3.11"
    return sysconfig.get_paths()["stdlib"]


def python_files():
    root = stdlib_dir()
    files = []
    for path in glob.glob(os.path.join(root, "**", "*.py"), recursive=True):
        rel = os.path.relpath(path, root)
        if rel.startswith(("dist-packages", "site-packages")):
            continue
        files.append(path)
    return sorted(files)


def prose_files():
    files = sorted(glob.glob("/usr/share/common-licenses/*"))
    files += sorted(glob.glob("/usr/share/doc/*/copyright"))
    return [f for f in files if os.path.isfile(f) and not os.path.islink(f)]


def read_lines(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return []
    text = data.decode("utf-8", errors="replace")
    # Keep line terminators out: each corpus line is one encode input.
    return text.split("\n")


def python_text():
    """All of the stdlib sources, one string per file (for training)."""
    for path in python_files():
        yield "\n".join(read_lines(path))


def prose_text():
    for path in prose_files():
        yield "\n".join(read_lines(path))


def edge_cases():
    import json
    with open(_EDGE_CASES, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# Characters the random lines are drawn from: every class the pre-tokenizer regexes,
# NFC and the added-token matcher treat differently.
_POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789",
    " " * 8 + "\t\n\r",
    "'sStTrReEvVmMlLdD",
    "!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~",
    "\u00a0\u1680\u2000\u2002\u2003\u2009\u200a\u202f\u205f\u3000\u0085\u2028\u2029"
    "\u000b\u000c\u001c\u001d\u001e\u001f\u180e\u200b\u200c\u200d\ufeff",
    "\u0300\u0301\u0302\u0303\u0308\u0323\u0327\u0328\u031b\u0345\u05b0\u0653\u093c"
    "\u0bbe\u0cd5\u302a\u3099\u309a\u1dc0\u20d0\ufe20",
    # Marks newer than Unicode 9.0 (class 0 for HF's normalizer, see
    # scheduler/tokenizer/gen/gen_unicode_tables.py).
    "\u08d3\u1ac7\u1acb\u0c3c\u1df7\u1df6\u0301\u0323\u09bc",
    "aeiouAEIOUnNcCsSzZ\u00e9\u00c5\u212b\u2126\u1e9b\u0958\u2adc\u0344\u0f73",
    "\u1100\u1101\u1161\u1162\u11a8\u11a9\uac00\uac01\ud7a3\u3131",
    "\u4e00\u4e8c\u4e09\u65e5\u672c\u8a9e\u3042\u30a2\u30fc\u3002\uff01\uff10\uff21",
    "\u0410\u0431\u0432\u03b1\u03b2\u03a9\u05d0\u05d1\u0627\u0644\u0915\u093f\u0e01"
    "\u0e31\u1000",
    "\U0001f600\U0001f44d\U0001f3fd\u200d\U0001f468\U0001f469\U0001f467\u2764\ufe0f"
    "\U0001f1fa\U0001f1f8\U0001f9d1\U0001f3fb",
    "\u00bd\u00b2\u2167\u2460\u0660\u0661\u06f1\u0966\uff11\U0001d7d8",
    "\ufffd\u00ff\u0100\u017f\u212a\u0130\u0131\u1e9e\u00df\ufb01",
]
_SPECIAL_SNIPPETS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|sep|>",
                     "<mask>", "[[word]]", "<|im_start", "|>", "<|", "<tool>", "</tool>",
                     "cafe\u0301", "caf\u00e9", "\u212bngstr\u00f6m", "\u00c5ngstr\u00f6m"]


def random_lines(n, seed=1234):
    """`n` random strings mixing all the character pools above and special tokens."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.08:
                parts.append(rng.choice(_SPECIAL_SNIPPETS))
                continue
            pool = rng.choice(_POOLS)
            parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 6))))
        out.append("".join(parts))
    return out


def parity_lines(max_python=9000, max_prose=4000, n_random=3000):
    """The parity corpus: real code, real prose, random mixes and the edge cases."""
    lines = []
    for path in python_files():
        lines.extend(read_lines(path))
        if len(lines) >= max_python * 3:
            break
    # Every third line keeps variety across files while bounding run time.
    code = [l for l in lines if l.strip()][::3][:max_python]
    prose = []
    for path in prose_files():
        prose.extend(l for l in read_lines(path) if l.strip())
        if len(prose) >= max_prose:
            break
    prose = prose[:max_prose]
    # Multi-line inputs too: a line alone never holds "\n" sequences and CRLF.
    multi = ["\n".join(code[i:i + 7]) for i in range(0, min(len(code), 2100), 7)]
    multi += ["\r\n".join(prose[i:i + 5]) + "\r\n" for i in range(0, min(len(prose), 500), 5)]
    return edge_cases() + code + prose + multi + random_lines(n_random)


def bench_text():
    """About 4 MB of code and prose (3:1), as a list of lines (for the benchmark)."""
    code, prose = [], []
    for path in python_files():
        code.extend(read_lines(path))
        if sum(map(len, code)) > 3_000_000:
            break
    for path in prose_files():
        prose.extend(read_lines(path))
        if sum(map(len, prose)) > 1_000_000:
            break
    return code + prose
