"""Encode throughput, one thread: specserve's C++ tokenizer beside HF tokenizers.

  bazel build //tools/tokenizer_bench:tokenizer_bench   (.bazelrc builds with -O2)
  python3 tools/tokenizer_bench/bench.py [--out results.json] [--min_seconds 2]

Both sides encode the same lines (tests/tokenizer/corpus.bench_text(): stdlib Python
sources and license texts, about 4 MB) with each committed test tokenizer. HF runs with
TOKENIZERS_PARALLELISM=false, once as `encode_batch` over all lines and once as
`encode` per line; the C++ side calls Encode per line (bench.cc). "cold" is the first
pass over the text (empty BPE caches on both sides: HF is timed on a fresh Tokenizer);
"warm" is the best of the repeated passes. Prints a table and writes JSON.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "tokenizer"))
import corpus  # noqa: E402

TOKENIZERS = ["qwen2_style", "gpt2_style"]


def time_passes(fn, min_seconds):
    cold = None
    best, total, passes = float("inf"), 0.0, 0
    while cold is None or total < min_seconds or passes < 3:
        start = time.perf_counter()
        fn()
        s = time.perf_counter() - start
        if cold is None:
            cold = s
            continue
        best, total, passes = min(best, s), total + s, passes + 1
    return cold, best


def bench_hf(path, lines, nbytes, min_seconds):
    rows = []
    for mode in ("encode_batch", "encode per line"):
        tok = Tokenizer.from_file(path)  # fresh: empty cache for the cold pass
        if mode == "encode_batch":
            fn = lambda: tok.encode_batch(lines, add_special_tokens=False)  # noqa: E731
        else:
            fn = lambda: [tok.encode(l, add_special_tokens=False) for l in lines]  # noqa: E731
        cold, warm = time_passes(fn, min_seconds)
        rows.append({"impl": f"HF tokenizers ({mode})", "cold_mb_s": nbytes / cold / 1e6,
                     "warm_mb_s": nbytes / warm / 1e6})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="tokenizer_bench.json")
    parser.add_argument("--min_seconds", type=float, default=2.0)
    parser.add_argument("--bin", default=os.environ.get("TOKENIZER_BENCH_BIN") or os.path.join(
        ROOT, "bazel-bin", "tools", "tokenizer_bench", "tokenizer_bench"))
    args = parser.parse_args()

    lines = corpus.bench_text()
    nbytes = sum(len(l.encode("utf-8")) for l in lines)
    results = {"bytes": nbytes, "lines": len(lines), "tokenizers": {}}
    with tempfile.TemporaryDirectory() as tmp:
        input_path = os.path.join(tmp, "lines.jsonl")
        with open(input_path, "w", encoding="utf-8") as f:
            for l in lines:
                f.write(json.dumps(l) + "\n")
        for name in TOKENIZERS:
            path = os.path.join(ROOT, "tests", "tokenizer", "data", name, "tokenizer.json")
            out_path = os.path.join(tmp, name + ".json")
            subprocess.run([args.bin, f"--tokenizer={path}", f"--input={input_path}",
                            f"--min_seconds={args.min_seconds}", f"--json_out={out_path}"],
                           check=True, stdout=subprocess.DEVNULL)
            with open(out_path) as f:
                cpp = json.load(f)
            hf_tokens = sum(len(e.ids) for e in Tokenizer.from_file(path).encode_batch(
                lines, add_special_tokens=False))
            assert hf_tokens == cpp["tokens"], (name, hf_tokens, cpp["tokens"])
            rows = [{"impl": "specserve C++ (Encode per line)",
                     "cold_mb_s": cpp["cold_mb_s"], "warm_mb_s": cpp["warm_mb_s"]}]
            rows += bench_hf(path, lines, nbytes, args.min_seconds)
            results["tokenizers"][name] = {"tokens": cpp["tokens"], "rows": rows}

    print(f"encode throughput, 1 thread, {nbytes / 1e6:.2f} MB in {len(lines)} lines "
          f"(MB/s, higher is better)")
    print(f"{'tokenizer':<12} {'implementation':<34} {'cold':>8} {'warm':>8}")
    for name, r in results["tokenizers"].items():
        for row in r["rows"]:
            print(f"{name:<12} {row['impl']:<34} {row['cold_mb_s']:8.1f} "
                  f"{row['warm_mb_s']:8.1f}")
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
