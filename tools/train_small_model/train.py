#!/usr/bin/env python3
"""Train specserve's small default model: a qwen3_5 text model (Gated DeltaNet + gated full
attention) with an MTP head, on Python source code, in ONE run of under 9 minutes on one
H200 — tokenizer, data, training, evaluation, export and verification included.

Usage (GPU machine, from the repo root):
    PYTHONUNBUFFERED=1 python3 tools/train_small_model/train.py --profile default \\
        --out models/specserve-tiny-py --seed 0
CPU smoke test (development machine, ~2 minutes):
    python3 tools/train_small_model/train.py --profile smoke --out /tmp/smoke \\
        --source-dirs /usr/lib/python3.11 <site-packages>

Pipeline
  1. Data: every *.py under --source-dirs (default: /usr/lib/python3.12 plus the running
     Python's site-/dist-packages), walked in sorted order, skipping __pycache__, files over
     --max-file-kb, non-UTF-8 and NUL-containing files, and duplicates (same real path).
     A file is held out iff sha1(path relative to its source dir) mod 100 < 2, so the split
     is a pure function of the path. Training files are taken in sha1 order (a fixed
     pseudo-random order that does not favour one package) until --max-train-mb.
  2. Tokenizer: byte-level BPE (HF tokenizers), Qwen2-style: NFC, Split(Qwen2 regex,
     isolated) then ByteLevel(use_regex=False), all 256 byte symbols in the alphabet, no
     unknown token; vocab --vocab total, of which the last three ids are the special
     tokens <|endoftext|>, <|im_start|>, <|im_end|> (appended after the BPE vocab, as in
     Qwen). Trained on the first --tokenizer-mb of the training files.
  3. Encoding: encode_batch_fast in chunks, documents joined with <|endoftext|> into one
     int32 array kept on the device; training batches are random windows of --seq+1 tokens.
  4. Model: Qwen3_5ForCausalLM (transformers, PyTorch fallback for the delta rule) plus
     MtpHead from tools/make_reference/mtp_reference.py (the same module the fixtures use).
     loss = CE(trunk) + --mtp-weight · CE(MTP), where MTP row p reads the post-final-norm
     trunk hidden h_p and token t_{p+1} and predicts t_{p+2}; embed_tokens/lm_head shared,
     gradients flow into the trunk. fp32 master weights, bf16 autocast, AdamW, linear
     warmup then cosine decay over the TIME budget (training stops at --train-seconds or
     earlier if the whole run would exceed --time-budget).
  5. Evaluation on held-out files: trunk loss/accuracy, MTP loss/accuracy, and MTP draft-1
     agreement = fraction of rows p where argmax(MTP logits at p) == argmax(trunk logits at
     p+1), i.e. the greedy acceptance rate of draft position 1.
  6. Export to --out: config.json (+ "mtp_num_hidden_layers": 1), bf16 safetensors shards
     (<= --max-shard-mib each) with model.safetensors.index.json, tokenizer.json,
     tokenizer_config.json, generation_config.json, README.md (model card) and
     training_log.json. Then it reloads the directory with transformers and checks the
     logits equal the trained model's (bf16), the mtp.* tensors round-trip, and the
     tokenizer loads with both tokenizers and AutoTokenizer; the reported held-out numbers
     are those of the reloaded (shipped, bf16) weights.

Reproducibility: --seed seeds python/numpy/torch and the batch sampler, and the data and
tokenizer are deterministic functions of the source files. GPU kernels (atomics in the
backward pass, autotuned GEMMs) and the time-based schedule (step count depends on speed)
make reruns equal in quality, not bitwise.
"""

from __future__ import annotations

import time

T_START = time.time()  # the time budget counts from here, imports included

import argparse  # noqa: E402
import copy  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO_ROOT, "tools", "make_reference"))
from mtp_reference import MtpConfig, MtpHead, load_mtp_head, save_checkpoint  # noqa: E402

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2's pre-tokenizer pattern (contractions, letters with one leading non-letter, single
# digits, punctuation runs with trailing newlines, newline runs, whitespace).
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Settings per profile; any flag given on the command line overrides its profile value.
PROFILES = {
    # The real model (GPU machine, one H200): ~9.4M parameters, ~19 MB in bf16.
    "default": dict(
        device="cuda", hidden=256, layers=8, layer_pattern="lllf", heads=4, kv_heads=2, head_dim=64,
        lin_k_heads=2, lin_v_heads=4, lin_k_dim=64, lin_v_dim=64, conv_kernel=4, intermediate=768,
        partial_rotary=0.25, rope_theta=1e6, vocab=6144, seq=512, batch=64, lr=2e-3, min_lr_ratio=0.1,
        warmup_steps=150, weight_decay=0.1, mtp_weight=0.5, mtp_kd=0.0, train_seconds=390.0,
        time_budget=500.0, post_reserve=70.0, max_train_mb=240.0, tokenizer_mb=24.0, eval_mb=6.0,
        eval_windows=512, eval_batch=64, max_file_kb=256, log_every=25, sample_tokens=96, max_shard_mib=15.0,
    ),
    # CPU smoke test of the whole pipeline with a toy model.
    "smoke": dict(
        device="cpu", hidden=64, layers=4, layer_pattern="lllf", heads=4, kv_heads=2, head_dim=16,
        lin_k_heads=2, lin_v_heads=4, lin_k_dim=16, lin_v_dim=16, conv_kernel=4, intermediate=192,
        partial_rotary=0.25, rope_theta=1e6, vocab=6144, seq=128, batch=4, lr=3e-3, min_lr_ratio=0.1,
        warmup_steps=20, weight_decay=0.1, mtp_weight=0.5, mtp_kd=0.0, train_seconds=30.0, time_budget=400.0,
        post_reserve=60.0, max_train_mb=2.0, tokenizer_mb=2.0, eval_mb=0.5, eval_windows=16,
        eval_batch=4, max_file_kb=256, log_every=10, sample_tokens=32, max_shard_mib=1.0,
    ),
}


def log(msg: str):
    print(f"[{time.time() - T_START:7.1f}s] {msg}", flush=True)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="default", choices=sorted(PROFILES))
    ap.add_argument("--out", default=os.path.join("models", "specserve-tiny-py"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--source-dirs", nargs="*", default=None,
                    help="roots to collect *.py from (default: /usr/lib/python3.12 + this Python's site-packages)")
    for k, v in PROFILES["default"].items():
        flag = "--" + k.replace("_", "-")
        ap.add_argument(flag, type=type(v), default=None, help=f"(default profile: {v})")
    args = ap.parse_args()
    for k, v in PROFILES[args.profile].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.source_dirs is None:
        args.source_dirs = ["/usr/lib/python3.12"] + [
            p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages")) and os.path.isdir(p)]
    return args


# ----------------------------------------------------------------------------- data


def path_hash(key: str) -> int:
    return int(hashlib.sha1(key.encode("utf-8")).hexdigest()[:12], 16)


def collect_sources(args):
    """Returns (train_texts, eval_texts, stats). Deterministic for a given file tree."""
    seen, files = set(), []  # files: (key, abspath)
    for root in args.source_dirs:
        if not os.path.isdir(root):
            log(f"data: skipping missing source dir {root}")
            continue
        tag = os.path.basename(os.path.normpath(root))
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for fn in sorted(filenames):
                if not fn.endswith(".py"):
                    continue
                path = os.path.join(dirpath, fn)
                real = os.path.realpath(path)
                if real in seen or not os.path.isfile(real):
                    continue
                seen.add(real)
                files.append((tag + "/" + os.path.relpath(path, root), path))
    max_bytes = args.max_file_kb * 1024
    train, held = [], []
    for key, path in files:
        (held if path_hash(key) % 100 < 2 else train).append((path_hash(key), key, path))
    stats = dict(files_found=len(files), skipped_big=0, skipped_undecodable=0, skipped_empty=0)

    def read_until(items, cap_bytes):
        texts, total = [], 0
        for _, key, path in sorted(items):  # sha1 order: deterministic, package-agnostic
            if total >= cap_bytes:
                break
            try:
                if os.path.getsize(path) > max_bytes:
                    stats["skipped_big"] += 1
                    continue
                with open(path, "rb") as f:
                    raw = f.read()
                text = raw.decode("utf-8")
            except (OSError, UnicodeDecodeError):
                stats["skipped_undecodable"] += 1
                continue
            if "\x00" in text:
                stats["skipped_undecodable"] += 1
                continue
            if not text.strip():  # empty __init__.py files mostly
                stats["skipped_empty"] += 1
                continue
            texts.append(text)
            total += len(raw)
        return texts, total

    train_texts, train_bytes = read_until(train, args.max_train_mb * 1e6)
    eval_texts, eval_bytes = read_until(held, args.eval_mb * 1e6)
    stats.update(train_files=len(train_texts), train_bytes=train_bytes, heldout_files_available=len(held),
                 eval_files=len(eval_texts), eval_bytes=eval_bytes)
    return train_texts, eval_texts, stats


def train_tokenizer(texts, vocab_total: int):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, \
        processors, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False),
    ])
    tok.decoder = decoders.ByteLevel()
    # Like Qwen2's tokenizer.json; the post-processor only affects offsets, never ids.
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_total - len(SPECIAL_TOKENS), min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    # Specials go after the BPE vocab (Qwen's layout); never split, never normalized.
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL_TOKENS])
    return tok


def encode_corpus(tok, texts, eos_id: int, chunk: int = 512) -> np.ndarray:
    """All documents, each followed by <|endoftext|>, as one int32 array."""
    enc = getattr(tok, "encode_batch_fast", tok.encode_batch)  # _fast skips offsets
    parts = []
    for i in range(0, len(texts), chunk):
        for e in enc(texts[i : i + chunk], add_special_tokens=False):
            parts.append(np.asarray(e.ids, dtype=np.int32))
            parts.append(np.asarray([eos_id], dtype=np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def write_tokenizer_files(tok, out: str, eos_id: int, max_len: int):
    from transformers import GenerationConfig

    tok.save(os.path.join(out, "tokenizer.json"))
    added = {str(tok.token_to_id(s)): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                        "single_word": False, "special": True} for s in SPECIAL_TOKENS}
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "bos_token": None, "unk_token": None,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "added_tokens_decoder": added, "model_max_length": max_len,
        "clean_up_tokenization_spaces": False, "add_bos_token": False, "add_prefix_space": False,
        "split_special_tokens": False, "errors": "replace",
        # ChatML, as Qwen's: what gateways (SMG) render chat requests with.
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    GenerationConfig(bos_token_id=None, eos_token_id=eos_id, pad_token_id=eos_id, do_sample=False).save_pretrained(out)


# ----------------------------------------------------------------------------- model


def build_model(args, vocab: int, eos_id: int):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    pattern = args.layer_pattern
    layer_types = ["full_attention" if pattern[i % len(pattern)] == "f" else "linear_attention"
                   for i in range(args.layers)]
    cfg = Qwen3_5TextConfig(
        vocab_size=vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, layer_types=layer_types,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
        linear_num_key_heads=args.lin_k_heads, linear_num_value_heads=args.lin_v_heads,
        linear_key_head_dim=args.lin_k_dim, linear_value_head_dim=args.lin_v_dim,
        linear_conv_kernel_dim=args.conv_kernel, tie_word_embeddings=True, max_position_embeddings=4096,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": args.rope_theta,
                                            "partial_rotary_factor": args.partial_rotary},
        bos_token_id=None, eos_token_id=eos_id, pad_token_id=None,
    )
    cfg._attn_implementation = "sdpa"
    model = Qwen3_5ForCausalLM(cfg)
    head = MtpHead(MtpConfig.from_hf_config(cfg))
    # Same scheme as transformers' _init_weights: N(0, initializer_range), zero-centred norms at 0.
    with torch.no_grad():
        for name, p in head.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, cfg.initializer_range)
            else:
                p.zero_()
    return model, head


def param_groups(modules, weight_decay: float):
    """Decay matrices only; embeddings, norms, A_log, dt_bias, conv taps are not decayed."""
    decay, no_decay, seen = [], [], set()
    for m in modules:
        for name, p in m.named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            (decay if p.dim() == 2 and "embed_tokens" not in name else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def forward_losses(model, head, w: torch.Tensor, mtp_weight: float, mtp_kd: float = 0.0):
    """w: [B, S+1] token windows. Returns (loss, trunk CE, MTP CE, trunk logits, MTP logits).
    mtp_kd > 0 adds a distillation term: cross-entropy of the MTP row p against the trunk's
    (detached) distribution at row p+1, which is what greedy speculative acceptance measures.
    Off by default; a lever if draft agreement comes out low."""
    x, S = w[:, :-1], w.shape[1] - 1
    h = model.model(input_ids=x, use_cache=False).last_hidden_state  # post-final-norm
    logits = model.lm_head(h)
    V = logits.shape[-1]
    ce_trunk = F.cross_entropy(logits.float().reshape(-1, V), w[:, 1:].reshape(-1))
    # MTP rows p = 0..S-2: (h_p, t_{p+1}) at position p -> t_{p+2}.
    emb = model.model.embed_tokens(w[:, 1:S])
    hm = head(h[:, : S - 1], emb, torch.arange(S - 1, device=w.device), use_sdpa=True)
    mlogits = model.lm_head(hm)
    ce_mtp = F.cross_entropy(mlogits.float().reshape(-1, V), w[:, 2:].reshape(-1))
    loss = ce_trunk + mtp_weight * ce_mtp
    if mtp_kd > 0:
        target = torch.softmax(logits[:, 1:].detach().float(), dim=-1)
        loss = loss - mtp_kd * (target * torch.log_softmax(mlogits.float(), dim=-1)).sum(-1).mean()
    return loss, ce_trunk, ce_mtp, logits, mlogits


def autocast(device: str):
    return torch.autocast(device_type="cuda" if device.startswith("cuda") else "cpu", dtype=torch.bfloat16)


@torch.no_grad()
def evaluate(model, head, tokens: torch.Tensor, args) -> dict:
    """Non-overlapping windows of the held-out stream (the same windows every call)."""
    S = args.seq
    n = min(args.eval_windows, (tokens.numel() - 1) // S)
    if n == 0:
        return {}
    model.eval()
    head.eval()
    sums = dict(ce_trunk=0.0, ce_mtp=0.0, acc_trunk=0.0, acc_mtp=0.0, agree=0.0)
    rows_t = rows_m = 0
    for i in range(0, n, args.eval_batch):
        idx = torch.arange(i, min(n, i + args.eval_batch), device=tokens.device)[:, None] * S
        w = tokens[idx + torch.arange(S + 1, device=tokens.device)].long()
        with autocast(args.device):
            _, ce_t, ce_m, logits, mlogits = forward_losses(model, head, w, 0.0)
        b = w.shape[0]
        sums["ce_trunk"] += float(ce_t) * b * S
        sums["ce_mtp"] += float(ce_m) * b * (S - 1)
        pred_t = logits.argmax(-1)
        pred_m = mlogits.argmax(-1)
        sums["acc_trunk"] += float((pred_t == w[:, 1:]).sum())
        sums["acc_mtp"] += float((pred_m == w[:, 2:]).sum())
        sums["agree"] += float((pred_m == pred_t[:, 1:]).sum())  # draft-1 greedy acceptance
        rows_t += b * S
        rows_m += b * (S - 1)
    model.train()
    head.train()
    return dict(windows=n, tokens=rows_t, loss_trunk=sums["ce_trunk"] / rows_t, loss_mtp=sums["ce_mtp"] / rows_m,
                acc_trunk=sums["acc_trunk"] / rows_t, acc_mtp=sums["acc_mtp"] / rows_m,
                mtp_agreement=sums["agree"] / rows_m)


# ----------------------------------------------------------------------------- export / verify


@torch.no_grad()
def verify_export(out: str, model, head, tok, eval_tokens: torch.Tensor, eval_texts, args) -> dict:
    """Reload the exported directory as a user would; compare with the in-memory model."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, Qwen3_5ForCausalLM

    dev = args.device
    res = {}
    loaded = Qwen3_5ForCausalLM.from_pretrained(out, dtype=torch.bfloat16, attn_implementation="sdpa").to(dev).eval()
    # Cast parameters only: .to(bf16) would also round the fp32 RoPE inv_freq buffer, which
    # from_pretrained keeps in fp32.
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.data = p.data.to(torch.bfloat16)
    S = min(args.seq, eval_tokens.numel() - 1)
    x = eval_tokens[None, :S].long() if S > 0 else torch.tensor([[0, 1, 2]], device=dev)
    la, lb = loaded(input_ids=x, use_cache=False).logits, ref(input_ids=x, use_cache=False).logits
    res["logits_identical"] = bool(torch.equal(la, lb))
    res["logits_max_abs_diff"] = float((la.float() - lb.float()).abs().max())
    assert res["logits_max_abs_diff"] < 1e-2, f"reloaded logits differ: {res['logits_max_abs_diff']}"
    del ref, loaded
    head_loaded = load_mtp_head(out, torch.bfloat16)
    ours = {k: v.detach().to(torch.bfloat16).cpu() for k, v in head.state_dict().items()}
    res["mtp_tensors_identical"] = all(torch.equal(ours[k], v.cpu()) for k, v in head_loaded.state_dict().items())
    assert res["mtp_tensors_identical"], "mtp.* tensors did not round-trip"
    # Tokenizer: the file loads standalone and through AutoTokenizer, and both agree with
    # the trained tokenizer; decode(encode(text)) gives back NFC(text).
    import unicodedata

    t_file = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    t_auto = AutoTokenizer.from_pretrained(out)
    samples = [t[:2000] for t in eval_texts[:50]] or ["def f(x):\n    return x\n"]
    ok_file = all(t_file.encode(s, add_special_tokens=False).ids == tok.encode(s, add_special_tokens=False).ids
                  for s in samples)
    ok_auto = all(t_auto.encode(s, add_special_tokens=False) == tok.encode(s, add_special_tokens=False).ids
                  for s in samples)
    ok_round = all(t_file.decode(t_file.encode(s, add_special_tokens=False).ids) == unicodedata.normalize("NFC", s)
                   for s in samples)
    res.update(tokenizer_file_matches=ok_file, auto_tokenizer_matches=ok_auto, tokenizer_roundtrip=ok_round,
               auto_tokenizer_class=type(t_auto).__name__, auto_tokenizer_eos_id=t_auto.eos_token_id)
    assert ok_file and ok_auto, "tokenizer reload mismatch"
    return res


@torch.no_grad()
def greedy_sample(model, tok, prompt: str, n: int, eos_id: int, device: str) -> str:
    from transformers import GenerationConfig

    ids = torch.tensor([tok.encode(prompt, add_special_tokens=False).ids], device=device)
    gc = GenerationConfig(do_sample=False, max_new_tokens=n, eos_token_id=eos_id, pad_token_id=eos_id)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc)
    return tok.decode(out[0].tolist(), skip_special_tokens=False)


def write_model_card(out: str, info: dict):
    ev = info["eval_shipped"]
    d = info["data"]
    a = info["args"]
    lines = [
        "# specserve-tiny-py",
        "",
        "A small hybrid language model for testing specserve: a `qwen3_5` text model "
        "(Gated DeltaNet linear-attention layers mixed with gated full attention) plus a one-layer "
        "MTP head (`mtp.*`, vLLM's Qwen3.5 layout) for speculative decoding, trained from scratch on "
        "Python source code. It is a test artifact, not a useful assistant.",
        "",
        "## Model",
        f"- {info['params_trunk'] / 1e6:.2f}M trunk parameters + {info['params_mtp'] / 1e6:.2f}M MTP head; "
        f"weights bf16 on disk ({info['disk_bytes'] / 2**20:.1f} MiB in {len(info['weight_files'])} shard(s)).",
        f"- hidden {a['hidden']}, {a['layers']} layers `{''.join('f' if t == 'full_attention' else 'l' for t in info['layer_types'])}` "
        f"(l = Gated DeltaNet, f = gated full attention), attention heads {a['heads']}/{a['kv_heads']} kv, head_dim "
        f"{a['head_dim']}, partial RoPE {a['partial_rotary']} (theta {a['rope_theta']:g}); linear attention key heads "
        f"{a['lin_k_heads']}, value heads {a['lin_v_heads']}, dk {a['lin_k_dim']}, dv {a['lin_v_dim']}, conv kernel "
        f"{a['conv_kernel']}; MLP {a['intermediate']}; vocab {info['vocab']} (tied embeddings); trained context {a['seq']}.",
        "- MTP head: row p takes the post-final-norm trunk hidden h_p and token t_{p+1}, "
        "u = fc([norm_emb(embed(t_{p+1})), norm_hid(h_p)]), one full-attention decoder layer at RoPE position p, "
        "mtp.norm, shared lm_head; predicts t_{p+2}. See tools/make_reference/mtp_reference.py.",
        "- Loads with `transformers.Qwen3_5ForCausalLM.from_pretrained` (which ignores `mtp.*`).",
        "",
        "## Tokenizer",
        f"Byte-level BPE trained here ({info['vocab']} ids): NFC, Qwen2's split regex, ByteLevel; "
        "ids " + ", ".join(f"{s} = {info['special_ids'][s]}" for s in SPECIAL_TOKENS) + " (after the BPE vocab). "
        f"{info['bytes_per_token']:.2f} bytes per token on the training text.",
        "",
        "## Data",
        f"Python files (`*.py`) from {', '.join(a['source_dirs'])} on the training machine: "
        f"{d['files_found']} found; {d['train_files']} files / {d['train_bytes'] / 1e6:.1f} MB used for training "
        f"({info['train_tokens'] / 1e6:.1f}M tokens); held out: files whose sha1(relative path) mod 100 < 2 "
        f"({d['eval_files']} files, {info['eval_tokens'] / 1e6:.2f}M tokens). Documents joined with <|endoftext|>; "
        "random windows.",
        "",
        "## Training",
        f"- {info['steps']} steps of {a['batch']} x {a['seq']} tokens = {info['tokens_seen'] / 1e6:.1f}M tokens seen "
        f"(~{info['tokens_seen'] / max(1, info['train_tokens']):.1f} epochs), {info['train_wall_s']:.0f} s of training, "
        f"{info['total_wall_s']:.0f} s for the whole run, on {info['device_name']}.",
        f"- loss = CE(trunk) + {a['mtp_weight']} x CE(MTP)"
        + (f" + {a['mtp_kd']} x CE(MTP, trunk's next distribution)" if a["mtp_kd"] else "")
        + f"; AdamW (lr {a['lr']}, betas 0.9/0.95, wd {a['weight_decay']}), "
        f"{a['warmup_steps']} warmup steps then cosine decay (over wall time) to {a['min_lr_ratio']} x lr; bf16 autocast; "
        f"grad clip 1.0; seed {a['seed']}.",
        f"- Software: torch {torch.__version__}, transformers {info['transformers_version']}, "
        f"tokenizers {info['tokenizers_version']}.",
        "",
        "## Held-out results (shipped bf16 weights)",
        "| metric | value |",
        "| --- | --- |",
        f"| trunk loss (nats/token) | {ev['loss_trunk']:.4f} |",
        f"| trunk top-1 accuracy | {ev['acc_trunk']:.3f} |",
        f"| MTP loss (nats/token, predicting t+2) | {ev['loss_mtp']:.4f} |",
        f"| MTP top-1 accuracy vs text | {ev['acc_mtp']:.3f} |",
        f"| MTP draft-1 agreement with trunk greedy | {ev['mtp_agreement']:.3f} |",
        f"| tokens evaluated | {ev['tokens']} |",
        "",
        "## Greedy sample",
        "Prompt `def fibonacci(n):\\n`, greedy, up to "
        f"{a['sample_tokens']} tokens:",
        "",
        "```python",
        info["sample"].replace("```", "` ` `"),
        "```",
        "",
        "## Reproduce",
        "```",
        info["command"],
        "```",
        "GPU kernels and the time-based schedule make reruns equal in quality, not bitwise.",
        "",
    ]
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("\n".join(lines))


# ----------------------------------------------------------------------------- main


def main():
    args = parse_args()
    import tokenizers
    import transformers

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    dev = args.device
    if dev.startswith("cuda"):
        assert torch.cuda.is_available(), "CUDA requested but not available (use --device cpu)"
        torch.set_float32_matmul_precision("high")  # TF32 for the few fp32 matmuls outside autocast
        device_name = torch.cuda.get_device_name(0)
    else:
        device_name = "CPU"
    os.makedirs(args.out, exist_ok=True)
    phases = {}
    log(f"profile={args.profile} device={device_name} out={args.out} seed={args.seed}")
    log(f"sources: {args.source_dirs}")

    # 1. data ---------------------------------------------------------------
    t = time.time()
    train_texts, eval_texts, dstats = collect_sources(args)
    phases["collect_s"] = time.time() - t
    log(f"data: {dstats}")
    assert train_texts and eval_texts, "no training or held-out text found"

    # 2. tokenizer -----------------------------------------------------------
    t = time.time()
    tok_texts, acc = [], 0
    for s in train_texts:
        if acc >= args.tokenizer_mb * 1e6:
            break
        tok_texts.append(s)
        acc += len(s)
    tok = train_tokenizer(tok_texts, args.vocab)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    eos_id = tok.token_to_id("<|endoftext|>")
    special_ids = {s: tok.token_to_id(s) for s in SPECIAL_TOKENS}
    phases["tokenizer_s"] = time.time() - t
    log(f"tokenizer: vocab {vocab} (trained on {acc / 1e6:.1f} MB), specials {special_ids}, {phases['tokenizer_s']:.1f}s")

    # 3. encode ---------------------------------------------------------------
    t = time.time()
    train_ids = encode_corpus(tok, train_texts, eos_id)
    eval_ids = encode_corpus(tok, eval_texts, eos_id)
    phases["encode_s"] = time.time() - t
    bytes_per_token = dstats["train_bytes"] / max(1, train_ids.size)
    log(f"encode: {train_ids.size / 1e6:.2f}M train tokens, {eval_ids.size / 1e6:.3f}M held-out tokens, "
        f"{bytes_per_token:.2f} bytes/token, {phases['encode_s']:.1f}s")
    train_tok = torch.from_numpy(train_ids).to(dev)
    eval_tok = torch.from_numpy(eval_ids).to(dev)
    del train_texts
    assert train_tok.numel() > args.seq + 2, "not enough training tokens for one window"

    # 4. model ----------------------------------------------------------------
    model, head = build_model(args, vocab, eos_id)
    model.to(dev).train()
    head.to(dev).train()
    n_trunk = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in head.parameters())
    log(f"model: {n_trunk / 1e6:.2f}M trunk + {n_mtp / 1e6:.2f}M MTP parameters, layers {model.config.layer_types}")
    fused = dev.startswith("cuda")
    opt = torch.optim.AdamW(param_groups([model, head], args.weight_decay), lr=args.lr, betas=(0.9, 0.95),
                            eps=1e-8, fused=fused)
    params = [p for g in opt.param_groups for p in g["params"]]
    gen = torch.Generator(device=dev).manual_seed(args.seed)

    # 5. train ------------------------------------------------------------------
    t_train = time.time()
    # Stop at the training budget, or earlier so that export/verify still fit the whole-run budget.
    t_stop = min(t_train + args.train_seconds, T_START + args.time_budget - args.post_reserve)
    budget = max(1.0, t_stop - t_train)
    log(f"train: up to {budget:.0f}s of steps (batch {args.batch} x seq {args.seq})")
    S, B = args.seq, args.batch
    ar = torch.arange(S + 1, device=dev)
    history, step, tokens_seen = [], 0, 0
    t_log, tok_log = time.time(), 0
    while True:
        now = time.time()
        if now >= t_stop:
            break
        progress = (now - t_train) / budget
        lr = args.lr * min(1.0, (step + 1) / args.warmup_steps) * (
            args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, train_tok.numel() - S - 1, (B, 1), device=dev, generator=gen)
        w = train_tok[starts + ar].long()
        with autocast(dev):
            loss, ce_t, ce_m, _, _ = forward_losses(model, head, w, args.mtp_weight, args.mtp_kd)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        tokens_seen += B * S
        tok_log += B * S
        if step % args.log_every == 0 or step == 1:
            lt, lm, gn = ce_t.item(), ce_m.item(), gnorm.item()  # syncs the device
            el = time.time() - t_train
            rate = tok_log / max(1e-9, time.time() - t_log)
            t_log, tok_log = time.time(), 0
            history.append(dict(step=step, t=round(el, 2), lr=lr, loss_trunk=lt, loss_mtp=lm, grad_norm=gn,
                                tok_per_s=round(rate)))
            log(f"step {step:5d} t={el:6.1f}s lr={lr:.2e} loss {lt:.4f} mtp {lm:.4f} |g| {gn:.2f} {rate / 1e3:.0f}k tok/s")
            if not math.isfinite(lt):
                raise SystemExit("loss is not finite")
    if dev.startswith("cuda"):
        torch.cuda.synchronize()
    train_wall = time.time() - t_train
    phases["train_s"] = train_wall
    log(f"train: {step} steps, {tokens_seen / 1e6:.1f}M tokens in {train_wall:.1f}s")
    if dev.startswith("cuda"):
        log(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")

    # 6. evaluate the fp32 master weights (for reference) ------------------------------
    t = time.time()
    ev_master = evaluate(model, head, eval_tok, args)
    log(f"eval (fp32 master weights): {ev_master}")

    # 7. export ---------------------------------------------------------------------------
    files = save_checkpoint(model, head, args.out, torch.bfloat16, max_shard_bytes=int(args.max_shard_mib * 2**20))
    write_tokenizer_files(tok, args.out, eos_id, 4096)
    disk = sum(os.path.getsize(os.path.join(args.out, f)) for f in files)
    log(f"export: {files} ({disk / 2**20:.1f} MiB)")

    # 8. verify + evaluate the shipped weights ------------------------------------------------
    ver = verify_export(args.out, model, head, tok, eval_tok, eval_texts, args)
    log(f"verify: {ver}")
    from transformers import Qwen3_5ForCausalLM

    shipped = Qwen3_5ForCausalLM.from_pretrained(args.out, dtype=torch.float32, attn_implementation="sdpa").to(dev)
    shipped_head = load_mtp_head(args.out, torch.float32).to(dev)
    ev = evaluate(shipped, shipped_head, eval_tok, args)
    log(f"eval (shipped bf16 weights): {ev}")
    sample = greedy_sample(shipped.eval(), tok, "def fibonacci(n):\n", args.sample_tokens, eos_id, dev)
    log("sample:\n" + sample)
    phases["post_s"] = time.time() - t

    # 9. card + log --------------------------------------------------------------------------
    cmd = "PYTHONUNBUFFERED=1 python3 " + " ".join([os.path.relpath(__file__, REPO_ROOT)] + sys.argv[1:])
    info = dict(
        args=vars(args), data=dstats, vocab=vocab, special_ids=special_ids, bytes_per_token=bytes_per_token,
        train_tokens=int(train_ids.size), eval_tokens=int(eval_ids.size), layer_types=model.config.layer_types,
        params_trunk=n_trunk, params_mtp=n_mtp, weight_files=files, disk_bytes=disk, steps=step,
        tokens_seen=tokens_seen, train_wall_s=train_wall, device_name=device_name, eval_master=ev_master,
        eval_shipped=ev, verify=ver, sample=sample, phases=phases, history=history, command=cmd,
        transformers_version=transformers.__version__, tokenizers_version=tokenizers.__version__,
        torch_version=torch.__version__,
    )
    info["total_wall_s"] = time.time() - T_START
    write_model_card(args.out, info)
    with open(os.path.join(args.out, "training_log.json"), "w") as f:
        json.dump(info, f, indent=1, default=str)
        f.write("\n")
    total = time.time() - T_START
    rows = [("steps", f"{step}"), ("tokens seen", f"{tokens_seen / 1e6:.1f}M"),
            ("train wall", f"{train_wall:.0f}s"), ("total wall", f"{total:.0f}s"),
            ("held-out loss", f"{ev['loss_trunk']:.4f}"), ("MTP loss", f"{ev['loss_mtp']:.4f}"),
            ("trunk acc", f"{ev['acc_trunk']:.3f}"), ("MTP agreement", f"{ev['mtp_agreement']:.3f}"),
            ("size on disk", f"{disk / 2**20:.1f} MiB"), ("reload identical", str(ver["logits_identical"]))]
    print("\n| metric | value |\n| --- | --- |")
    for k, v in rows:
        print(f"| {k} | {v} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
