"""Trains the test tokenizers committed under tests/tokenizer/data/ (run by hand).

  python3 tests/tokenizer/train_tokenizers.py

- qwen2_style/tokenizer.json: the recipe of the project's default model (NFC,
  Split(Qwen2 regex, isolated) + ByteLevel(no prefix space, no regex), BPE 6144,
  ByteLevel decoder, specials <|endoftext|> <|im_start|> <|im_end|>), trained on the
  Python standard library. Merges are saved in the array format ["a", "b"].
- gpt2_style/tokenizer.json: plain ByteLevel pre-tokenizer (GPT-2 regex,
  add_prefix_space=true), BPE 12000 over prose + code, specials <|endoftext|>,
  <|sep|>, non-special <mask> (lstrip+rstrip) and [[word]] (single_word). Merges are
  rewritten in the legacy "a b" string format so that both formats stay tested.

Training is deterministic for a given machine's files (sorted inputs, single thread).
"""
import json
import os
import sys

os.environ["TOKENIZERS_PARALLELISM"] = "false"

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models,  # noqa: E402
                        normalizers, pre_tokenizers, processors, trainers)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def save(tok, name, legacy_merges=False):
    os.makedirs(os.path.join(DATA, name), exist_ok=True)
    path = os.path.join(DATA, name, "tokenizer.json")
    data = json.loads(tok.to_str())
    if legacy_merges:
        data["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m
                                   for m in data["model"]["merges"]]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    # Round trip through HF to be sure the file loads as written.
    Tokenizer.from_file(path)
    print(path, os.path.getsize(path), "bytes")


def train_qwen2_style():
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False,
                                 trim_offsets=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=6144, show_progress=False,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus.python_text(), trainer=trainer)
    save(tok, "qwen2_style")


def train_gpt2_style():
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(
        vocab_size=12000, show_progress=False, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())

    def text():
        yield from corpus.prose_text()
        for i, t in enumerate(corpus.python_text()):
            if i % 3 == 0:
                yield t

    tok.train_from_iterator(text(), trainer=trainer)
    tok.add_special_tokens([AddedToken("<|sep|>", special=True, normalized=False)])
    tok.add_tokens([
        AddedToken("<mask>", special=False, lstrip=True, rstrip=True, normalized=False),
        AddedToken("[[word]]", special=False, single_word=True),
    ])
    save(tok, "gpt2_style", legacy_merges=True)


if __name__ == "__main__":
    train_qwen2_style()
    train_gpt2_style()
