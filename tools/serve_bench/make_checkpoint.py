#!/usr/bin/env python3
"""make_checkpoint: a random-weight qwen3_5 checkpoint in Hugging Face format,
for serving benchmarks of shapes whose real weights cannot be shipped.

    tools/serve_bench/make_checkpoint.py --out /dev/shm/serve_bench/qwen35_27b
    tools/serve_bench/make_checkpoint.py --out /tmp/x --layers 4 --hidden 256 \\
        --intermediate 512 --vocab 6144 --heads 4 --kv-heads 2 --head-dim 64 \\
        --linear-key-heads 2 --linear-value-heads 4 --linear-head-dim 64

The default shape is the Qwen3.5-27B text model that tools/cuda_bench uses
(random_model.cc's Qwen35_27BConfigJson: hidden 5120, 64 layers with every
4th full attention, 24/4 attention heads of 256, 16/48 linear-attention heads
of 128, MLP 17408, vocabulary 248320, untied lm_head, one MTP layer): about
51 GB of bf16 in shards of --shard-gb plus model.safetensors.index.json.

Tensor names are transformers' Qwen3_5ForCausalLM ones ("model.layers.3.
linear_attn.in_proj_qkv.weight", "model.norm.weight", "lm_head.weight") and
the MTP head's vLLM layout ("mtp.fc.weight", "mtp.layers.0.self_attn.q_proj.
weight"), as tools/make_reference writes them; the list and every shape are
worker/model_files/checkpoint.cc's ExpectedTensors. Values: matrices and the
embedding N(0, std^2) (default std 0.02, so activations and logits stay
O(1) through 64 layers and every logit is finite), zero-centred norm weights
N(0, std^2) (the forward applies 1 + w), the gated norm 1 + N(0, std^2),
conv taps N(0, 0.3^2), A_log = log U(1, 16) and dt_bias = 1 (transformers'
initialisation).

With torch (the GPU machine) every tensor is drawn on --device (cuda when
there is one) in bf16 and copied to the host; without torch numpy draws it
(for small shapes: the CPU smoke test). The bytes are written by this file's
safetensors writer (the format: an 8-byte header length, the JSON header,
the raw data), by a few threads, one shard each.

It also copies --tokenizer (models/default/tokenizer.json) when every id it
knows is below the vocabulary size; otherwise the model serves token ids
only. A stamp file written last (serve_bench_checkpoint.json) records the
shape, std and seed: a directory whose stamp and files match is kept as is
(--force rewrites it).
"""
import argparse
import concurrent.futures
import json
import math
import os
import shutil
import sys
import threading
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
STAMP = "serve_bench_checkpoint.json"
WRITER_VERSION = 1

# The Qwen3.5-27B text shape (tools/cuda_bench/random_model.cc).
SHAPE_27B = dict(vocab=248320, hidden=5120, intermediate=17408, layers=64,
                 full_attention_interval=4, heads=24, kv_heads=4, head_dim=256,
                 linear_key_heads=16, linear_value_heads=48,
                 linear_head_dim=128, conv_kernel=4, mtp_layers=1,
                 max_position=262144, tie=False)
# The CPU smoke test's shape: small enough for a CPU worker to decode in a
# millisecond, vocabulary large enough for models/default's tokenizer.
SHAPE_TINY = dict(vocab=6144, hidden=64, intermediate=128, layers=4,
                  full_attention_interval=4, heads=4, kv_heads=2, head_dim=32,
                  linear_key_heads=2, linear_value_heads=4, linear_head_dim=32,
                  conv_kernel=4, mtp_layers=1, max_position=4096, tie=False)
SHAPES = {"27b": SHAPE_27B, "tiny": SHAPE_TINY}


def config_json(s):
    """config.json of shape `s`, with the fields random_model.cc writes."""
    types = ["full_attention" if (i + 1) % s["full_attention_interval"] == 0
             else "linear_attention" for i in range(s["layers"])]
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "vocab_size": s["vocab"],
        "hidden_size": s["hidden"],
        "intermediate_size": s["intermediate"],
        "num_hidden_layers": s["layers"],
        "full_attention_interval": s["full_attention_interval"],
        "layer_types": types,
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"],
        "head_dim": s["head_dim"],
        "linear_num_key_heads": s["linear_key_heads"],
        "linear_num_value_heads": s["linear_value_heads"],
        "linear_key_head_dim": s["linear_head_dim"],
        "linear_value_head_dim": s["linear_head_dim"],
        "linear_conv_kernel_dim": s["conv_kernel"],
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": s["tie"],
        "rope_parameters": {"rope_theta": 10000000.0,
                            "partial_rotary_factor": 0.25,
                            "rope_type": "default"},
        "partial_rotary_factor": 0.25,
        "max_position_embeddings": s["max_position"],
        "mtp_num_hidden_layers": s["mtp_layers"],
        "eos_token_id": s["vocab"] - 1 if s["vocab"] < 248045 else 248044,
        "hidden_act": "silu",
        "attention_bias": False,
        "dtype": "bfloat16",
    }


def _layer(c, p, full):
    """The decoder-layer tensors under prefix p (checkpoint.cc AddLayer)."""
    h, inter = c["hidden_size"], c["intermediate_size"]
    out = [(p + "input_layernorm.weight", [h]),
           (p + "post_attention_layernorm.weight", [h])]
    if not full:
        a = p + "linear_attn."
        nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
        vd = nv * dv
        cd = 2 * nk * dk + vd
        out += [(a + "in_proj_qkv.weight", [cd, h]),
                (a + "in_proj_z.weight", [vd, h]),
                (a + "in_proj_b.weight", [nv, h]),
                (a + "in_proj_a.weight", [nv, h]),
                (a + "conv1d.weight", [cd, 1, c["linear_conv_kernel_dim"]]),
                (a + "dt_bias", [nv]),
                (a + "A_log", [nv]),
                (a + "norm.weight", [dv]),
                (a + "out_proj.weight", [h, vd])]
    else:
        a = p + "self_attn."
        hd, nh, nkv = c["head_dim"], c["num_attention_heads"], \
            c["num_key_value_heads"]
        out += [(a + "q_proj.weight", [2 * nh * hd, h]),
                (a + "k_proj.weight", [nkv * hd, h]),
                (a + "v_proj.weight", [nkv * hd, h]),
                (a + "o_proj.weight", [h, nh * hd]),
                (a + "q_norm.weight", [hd]),
                (a + "k_norm.weight", [hd])]
    out += [(p + "mlp.gate_proj.weight", [inter, h]),
            (p + "mlp.up_proj.weight", [inter, h]),
            (p + "mlp.down_proj.weight", [h, inter])]
    return out


def tensor_list(c):
    """[(stored name, shape)]: checkpoint.cc's ExpectedTensors with the names
    transformers (trunk) and vLLM (MTP head) store."""
    h, v = c["hidden_size"], c["vocab_size"]
    out = [("model.embed_tokens.weight", [v, h])]
    for i, t in enumerate(c["layer_types"]):
        out += _layer(c, "model.layers.%d." % i, t == "full_attention")
    out.append(("model.norm.weight", [h]))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", [v, h]))
    if c["mtp_num_hidden_layers"] > 0:
        out += [("mtp.fc.weight", [h, 2 * h]),
                ("mtp.pre_fc_norm_embedding.weight", [h]),
                ("mtp.pre_fc_norm_hidden.weight", [h]),
                ("mtp.norm.weight", [h])]
        for j in range(c["mtp_num_hidden_layers"]):
            out += _layer(c, "mtp.layers.%d." % j, True)
    return out


def init_rule(name, std):
    """(kind, a, b): 'normal' N(a, b^2) or 'log_uniform' log U(a, b) or
    'const' a."""
    if name.endswith("A_log"):
        return ("log_uniform", 1.0, 16.0)
    if name.endswith("dt_bias"):
        return ("const", 1.0, 0.0)
    if name.endswith("conv1d.weight"):
        return ("normal", 0.0, 0.3)
    if name.endswith("linear_attn.norm.weight"):
        return ("normal", 1.0, std)
    return ("normal", 0.0, std)


def plan_shards(tensors, shard_bytes):
    """[[(name, shape, nbytes)]] in order, each shard at most shard_bytes
    (a larger tensor gets a shard of its own)."""
    shards, cur, size = [], [], 0
    for name, shape in tensors:
        n = 2 * math.prod(shape)
        if cur and size + n > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append((name, shape, n))
        size += n
    if cur:
        shards.append(cur)
    return shards


def safetensors_header(entries):
    """The header bytes (length prefix included) of a file holding
    `entries` [(name, shape, nbytes)] back to back, all bf16."""
    header, off = {}, 0
    for name, shape, n in entries:
        header[name] = {"dtype": "BF16", "shape": list(shape),
                        "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":"))
    h += " " * (-len(h) % 8)
    return len(h).to_bytes(8, "little") + h.encode("utf-8")


class TorchSource:
    """Draws tensors on a torch device (cuda when available) in bf16."""

    def __init__(self, device, seed):
        import torch
        self.torch = torch
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = device
        self.gen = torch.Generator(device=device).manual_seed(seed)

    def draw(self, shape, rule):
        t = self.torch
        kind, a, b = rule
        if kind == "normal":
            x = t.randn(shape, device=self.device, dtype=t.bfloat16,
                        generator=self.gen)
            x.mul_(b)
            if a:
                x.add_(a)
        elif kind == "log_uniform":
            x = t.empty(shape, device=self.device, dtype=t.float32)
            x.uniform_(a, b, generator=self.gen).log_()
            x = x.to(t.bfloat16)
        else:
            x = t.full(shape, a, device=self.device, dtype=t.bfloat16)
        # A host copy viewed as bytes: what the file holds.
        return x.cpu().contiguous().view(t.int16).numpy()

    def finish(self):
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()


class NumpySource:
    """Draws tensors with numpy (fp32, rounded to bf16 bits): no torch."""

    def __init__(self, seed):
        import numpy as np
        self.np = np
        self.rng = np.random.default_rng(seed)
        self.device = "numpy"

    def draw(self, shape, rule):
        np = self.np
        kind, a, b = rule
        if kind == "normal":
            x = self.rng.standard_normal(shape, dtype=np.float32) * np.float32(b)
            x += np.float32(a)
        elif kind == "log_uniform":
            x = np.log(self.rng.uniform(a, b, size=shape)).astype(np.float32)
        else:
            x = np.full(shape, a, dtype=np.float32)
        bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
        # Round to nearest even at bit 16 (finite values only here).
        bits = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
        return bits.astype(np.uint16)

    def finish(self):
        pass


def make_source(backend, device, seed):
    if backend in ("auto", "torch"):
        try:
            return TorchSource(device, seed)
        except ImportError:
            if backend == "torch":
                raise
    return NumpySource(seed)


def _write_all(fd, buf):
    view = memoryview(buf).cast("B")
    while view:
        n = os.write(fd, view)
        view = view[n:]


def write_shard(path, entries, arrays):
    fd = os.open(path + ".tmp", os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
    try:
        _write_all(fd, safetensors_header(entries))
        for (name, _, n), arr in zip(entries, arrays):
            if arr.nbytes != n:
                raise RuntimeError("%s: %d bytes, expected %d" % (name, arr.nbytes, n))
            _write_all(fd, arr)
    finally:
        os.close(fd)
    os.replace(path + ".tmp", path)


def shard_names(n):
    if n == 1:
        return ["model.safetensors"]
    return ["model-%05d-of-%05d.safetensors" % (i + 1, n) for i in range(n)]


def stamp_of(config, args):
    return {"writer_version": WRITER_VERSION, "config": config, "std": args.std,
            "seed": args.seed, "shard_gb": args.shard_gb}


def existing_ok(out, stamp):
    """Whether `out` already holds this checkpoint (stamp and file sizes)."""
    try:
        with open(os.path.join(out, STAMP)) as f:
            old = json.load(f)
    except (OSError, ValueError):
        return False
    if old.get("stamp") != stamp:
        return False
    for name, size in old.get("files", {}).items():
        p = os.path.join(out, name)
        if not os.path.isfile(p) or os.path.getsize(p) != size:
            return False
    return True


def tokenizer_max_id(path):
    with open(path, encoding="utf-8") as f:
        tok = json.load(f)
    ids = list((tok.get("model") or {}).get("vocab", {}).values() or [0])
    ids += [t["id"] for t in tok.get("added_tokens", [])]
    return max(ids)


def shape_from_args(args):
    s = dict(SHAPES[args.shape])
    for key in s:
        v = getattr(args, key, None)
        if v is not None:
            s[key] = v
    return s


def make(args, log=print):
    """Writes (or keeps) the checkpoint; returns a summary dict."""
    s = shape_from_args(args)
    config = config_json(s)
    tensors = tensor_list(config)
    total = sum(2 * math.prod(shape) for _, shape in tensors)
    stamp = stamp_of(config, args)
    out = args.out
    summary = {"dir": out, "bytes": total, "tensors": len(tensors),
               "config": config}
    if not args.force and existing_ok(out, stamp):
        log("make_checkpoint: %s already holds this checkpoint (%.2f GB); kept"
            % (out, total / 1e9))
        summary.update(kept=True, seconds=0.0)
        summary["tokenizer"] = os.path.exists(os.path.join(out, "tokenizer.json"))
        return summary
    os.makedirs(out, exist_ok=True)
    for fn in os.listdir(out):  # stale shards of another layout
        if fn.startswith("model") and ".safetensors" in fn or fn == STAMP:
            os.remove(os.path.join(out, fn))
    free = shutil.disk_usage(out).free
    if free < total * 1.02:
        raise SystemExit("make_checkpoint: %s has %.1f GB free, the checkpoint "
                         "needs %.1f GB" % (out, free / 1e9, total / 1e9))
    t0 = time.monotonic()
    src = make_source(args.backend, args.device, args.seed)
    shards = plan_shards(tensors, int(args.shard_gb * 1e9))
    names = shard_names(len(shards))
    log("make_checkpoint: %s: %d tensors, %.2f GB bf16 in %d file(s), drawn "
        "on %s" % (out, len(tensors), total / 1e9, len(shards), src.device))
    # Up to `writers` shards are written while the next is drawn.
    inflight = threading.Semaphore(args.writers + 1)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.writers)
    futures = []

    def write(path, entries, arrays):
        try:
            write_shard(path, entries, arrays)
        finally:
            inflight.release()

    try:
        for fname, entries in zip(names, shards):
            inflight.acquire()
            arrays = [src.draw(shape, init_rule(name, args.std))
                      for name, shape, _ in entries]
            futures.append(pool.submit(write, os.path.join(out, fname),
                                       entries, arrays))
            del arrays
        for f in futures:
            f.result()
    finally:
        pool.shutdown(wait=True)
    src.finish()
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    files = {n: os.path.getsize(os.path.join(out, n)) for n in names}
    if len(names) > 1:
        index = {"metadata": {"total_size": total},
                 "weight_map": {name: fname for fname, entries in zip(names, shards)
                                for name, _, _ in entries}}
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=1)
    tok = False
    if args.tokenizer and os.path.exists(args.tokenizer):
        top = tokenizer_max_id(args.tokenizer)
        if top < s["vocab"]:
            shutil.copyfile(args.tokenizer, os.path.join(out, "tokenizer.json"))
            tok = True
        else:
            log("make_checkpoint: %s knows id %d >= vocabulary %d: no "
                "tokenizer (token ids only)" % (args.tokenizer, top, s["vocab"]))
    if not tok and os.path.exists(os.path.join(out, "tokenizer.json")):
        os.remove(os.path.join(out, "tokenizer.json"))
    secs = time.monotonic() - t0
    with open(os.path.join(out, STAMP), "w") as f:
        json.dump({"stamp": stamp, "files": files, "seconds": secs,
                   "device": src.device}, f, indent=1)
    log("make_checkpoint: wrote %.2f GB in %.1f s (%.2f GB/s)%s" % (
        total / 1e9, secs, total / 1e9 / max(secs, 1e-9),
        "; tokenizer.json copied" if tok else ""))
    summary.update(kept=False, seconds=secs, tokenizer=tok, device=src.device)
    return summary


def add_args(ap):
    ap.add_argument("--out", required=True, help="model directory to write")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="27b",
                    help="base shape; the flags below override its fields")
    for key, help_ in (("layers", "num_hidden_layers"), ("hidden", "hidden_size"),
                       ("intermediate", "intermediate_size"), ("vocab", "vocab_size"),
                       ("heads", "num_attention_heads"),
                       ("kv_heads", "num_key_value_heads"), ("head_dim", "head_dim"),
                       ("linear_key_heads", "linear_num_key_heads"),
                       ("linear_value_heads", "linear_num_value_heads"),
                       ("linear_head_dim", "linear key and value head dim"),
                       ("full_attention_interval", "every N-th layer is full attention"),
                       ("mtp_layers", "mtp_num_hidden_layers (0 = no MTP head)"),
                       ("max_position", "max_position_embeddings")):
        ap.add_argument("--" + key.replace("_", "-"), dest=key, type=int,
                        help=help_)
    ap.add_argument("--std", type=float, default=0.02,
                    help="std of the matrices and the embedding")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--shard-gb", type=float, default=4.0)
    ap.add_argument("--writers", type=int, default=3,
                    help="shards written at once")
    ap.add_argument("--backend", choices=("auto", "torch", "numpy"),
                    default="auto", help="auto: torch when importable")
    ap.add_argument("--device", default="auto",
                    help="torch device (auto: cuda when available)")
    ap.add_argument("--tokenizer",
                    default=os.path.join(REPO, "models", "default", "tokenizer.json"),
                    help="copied when its ids fit the vocabulary ('' = none)")
    ap.add_argument("--force", action="store_true",
                    help="rewrite even when the stamp matches")


def main(argv):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    add_args(ap)
    args = ap.parse_args(argv)
    make(args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
