#!/usr/bin/env python3
"""make_reference: tiny random qwen3_5 checkpoints (with an MTP head) and JSON fixtures of
transformers' outputs for the C++ engine's exactness tests.

Subcommands
-----------
  tiny      python3 tools/make_reference/make_reference.py tiny --out tests/models/tiny_a --variant a --seed 1
            Builds a RANDOM Qwen3_5ForCausalLM from one of the VARIANTS below (awkward dims on
            purpose), randomizes every weight at magnitudes that make mistakes visible,
            adds an MTP head (mtp.* tensors, vLLM's Qwen3.5 layout) and writes config.json
            (+ "mtp_num_hidden_layers": 1) and model.safetensors (fp32, or bf16 for variant c).
            Then reloads the directory and runs the checks of `check`.
            Variants: a, b, c (see VARIANTS); `--variant all --out tests/models` writes tiny_a..c.

  fixtures  python3 tools/make_reference/make_reference.py fixtures --model tests/models/tiny_a \\
                --out tests/fixtures/tiny_a.json --random-prompts 5 --prompt-len 1,2,9,17,24 \\
                --seed 1 --gen 24 --mtp-k 3
            (or --prompts-file F: a .json list of id lists / strings, or a text file with one
            prompt per line, "\\n" escapes allowed; text needs tokenizer.json in the model dir).
            Computes in float32 on CPU, attn_implementation="eager", and writes per prompt:
              ids            prompt ids [T]
              logits         [T][V] full forward, use_cache=False, every position
              greedy         --gen tokens of model.generate(do_sample=False) (cache path;
                             EOS stopping disabled so every prompt has exactly --gen tokens)
              greedy_margin  top-1 minus top-2 of generate's raw logits at each step
              mtp_logits     [T-1][V] MTP draft logits of rows p = 0..T-2: input (h_p, t_{p+1}),
                             RoPE position p, causal over MTP rows 0..p
              mtp_chain      {start_token: HF's greedy next token t_T, draft_ids [k], logits [k][V]}:
                             step 1 = (h_{T-1}, t_T) at position T-1 with the MTP KV holding rows
                             0..T-2 (true trunk hiddens); step j+1 = (h'_j, draft_j) at T-1+j.
            Top level: model (path relative to the repo root), dtype_compute, transformers_version,
            config_summary, gen, mtp_k. Floats are rounded to 7 significant digits.
            Before writing, it checks the fixture's own consistency (see check_prompt).

  check     python3 tools/make_reference/make_reference.py check --model DIR
            Sanity checks on any checkpoint: (1) transformers with cache (prefill, then one
            token at a time) vs no-cache logits, (2) our MTP decoder layer vs transformers'
            Qwen3_5DecoderLayer on the same weights, (3) MTP incremental vs one-pass rows.

h_p is always the trunk hidden AFTER the final norm (model.model(...).last_hidden_state,
what lm_head reads), per docs/MODEL.md. The MTP head itself lives in
mtp_reference.py (shared with tools/train_small_model/train.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mtp_reference import (  # noqa: E402
    MtpConfig,
    MtpHead,
    load_mtp_head,
    mtp_draft_chain,
    mtp_row_logits,
    read_config,
    save_checkpoint,
)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIN, FULL = "linear_attention", "full_attention"
# transformers' own cached vs uncached fp32 logits differ by ~1e-4 on these models (see
# check_prompt); anything well above that is a real disagreement.
HF_PATH_TOL = 5e-4

# Each variant stresses different shape paths of the engine. Sizes stay ~300 KB on disk.
VARIANTS = {
    # irregular layer pattern, nv/nk = 3, dk != dv, odd vocab, head_dim 24 (not 2^n),
    # rotary dim 6, GQA 2, conv kernel 4, tied embedding, fp32 on disk.
    "a": dict(vocab_size=317, hidden_size=32, intermediate_size=48,
              layer_types=[LIN, FULL, LIN, LIN, FULL],
              num_attention_heads=4, num_key_value_heads=2, head_dim=24, partial_rotary_factor=0.25,
              linear_num_key_heads=1, linear_num_value_heads=3, linear_key_head_dim=8,
              linear_value_head_dim=12, linear_conv_kernel_dim=4,
              tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=10000.0, dtype="float32"),
    # starts with full attention, nv/nk = 3 with 2 key heads, dk > dv, GQA 3, head_dim 20,
    # rotary dim 10 (factor 0.5), conv kernel 3, UNtied lm_head, eps 1e-5, big theta.
    "b": dict(vocab_size=301, hidden_size=32, intermediate_size=48,
              layer_types=[FULL, LIN, LIN, FULL],
              num_attention_heads=3, num_key_value_heads=1, head_dim=20, partial_rotary_factor=0.5,
              linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=12,
              linear_value_head_dim=8, linear_conv_kernel_dim=3,
              tie_word_embeddings=False, rms_norm_eps=1e-5, rope_theta=1000000.0, dtype="float32"),
    # bf16 weights on disk (the engine must load bf16), nv/nk = 2, head_dim 40, rotary dim 10,
    # ends with full attention, wider hidden.
    "c": dict(vocab_size=389, hidden_size=48, intermediate_size=96,
              layer_types=[LIN, LIN, FULL],
              num_attention_heads=2, num_key_value_heads=1, head_dim=40, partial_rotary_factor=0.25,
              linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
              linear_value_head_dim=16, linear_conv_kernel_dim=4,
              tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=10000.0, dtype="bfloat16"),
}


# ----------------------------------------------------------------------------- tiny models


def build_config(v: dict):
    from transformers import Qwen3_5TextConfig

    v = dict(v)
    prf, theta = v.pop("partial_rotary_factor"), v.pop("rope_theta")
    v.pop("dtype")
    if int(v["head_dim"] * prf) % 2:
        raise ValueError("rotary dim must be even (rotate-half)")
    return Qwen3_5TextConfig(
        num_hidden_layers=len(v["layer_types"]),
        max_position_embeddings=1024,
        rope_parameters={"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": prf},
        **v,
    )


@torch.no_grad()
def randomize_(named_params, gen: torch.Generator, hidden: int):
    """Weights at scales where every term matters: zero-centred norm weights clearly non-zero,
    gated-norm weights around 1, decays spread from fast to slow, conv taps O(1),
    projections ~ 1/sqrt(fan_in) so activations stay O(1), and an embedding/lm_head scale
    that gives logits a spread of a few units (far from uniform, far from one-hot)."""

    def normal(shape, std):
        return torch.randn(shape, generator=gen) * std

    for name, p in named_params:
        leaf = name.split(".")[-2] if name.endswith(".weight") else name.split(".")[-1]
        if name.endswith("embed_tokens.weight"):
            p.copy_(normal(p.shape, 0.6))
        elif name == "lm_head.weight":
            p.copy_(normal(p.shape, 2.5 / math.sqrt(hidden)))
        elif name.endswith("linear_attn.norm.weight"):  # gated norm: plain w, around 1
            p.copy_(1.0 + normal(p.shape, 0.25))
        elif leaf in ("input_layernorm", "post_attention_layernorm", "norm", "q_norm", "k_norm",
                      "pre_fc_norm_embedding", "pre_fc_norm_hidden"):  # zero-centred (1 + w)
            p.copy_(normal(p.shape, 0.3))
        elif name.endswith("A_log"):  # A in [0.05, 3]: decays exp(g) from ~0 to ~1
            p.copy_(torch.empty(p.shape).uniform_(math.log(0.05), math.log(3.0), generator=gen))
        elif name.endswith("dt_bias"):
            p.copy_(torch.empty(p.shape).uniform_(-2.0, 1.0, generator=gen))
        elif name.endswith("conv1d.weight"):
            p.copy_(normal(p.shape, 0.6))
        elif p.dim() == 2:  # every other projection
            p.copy_(normal(p.shape, 1.0 / math.sqrt(p.shape[1])))
        else:
            raise ValueError(f"no init rule for {name}")


def cmd_tiny(args):
    from transformers import Qwen3_5ForCausalLM

    names = sorted(VARIANTS) if args.variant == "all" else [args.variant]
    for vname in names:
        out = os.path.join(args.out, f"tiny_{vname}") if args.variant == "all" else args.out
        v = VARIANTS[vname]
        torch.manual_seed(args.seed)
        cfg = build_config(v)
        model = Qwen3_5ForCausalLM(cfg).eval()
        head = MtpHead(MtpConfig.from_hf_config(cfg)).eval()
        gen = torch.Generator().manual_seed(args.seed * 1000 + ord(vname))
        # Tied: lm_head.weight is the embedding parameter; named_parameters lists it once.
        randomize_(list(model.named_parameters()), gen, cfg.hidden_size)
        randomize_([("mtp." + n, p) for n, p in head.named_parameters()], gen, cfg.hidden_size)
        dtype = getattr(torch, v["dtype"])
        files = save_checkpoint(model, head, out, dtype)
        size = sum(os.path.getsize(os.path.join(out, f)) for f in files)
        print(f"[tiny {vname}] wrote {out} ({size / 1024:.0f} KB weights, {v['dtype']})")
        run_checks(out)


# ----------------------------------------------------------------------------- loading / checks


def load_model(model_dir: str):
    from transformers import Qwen3_5ForCausalLM

    model = Qwen3_5ForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    head = load_mtp_head(model_dir, torch.float32)
    return model, head


def model_as_float64(model_dir: str):
    from transformers import Qwen3_5ForCausalLM

    model = Qwen3_5ForCausalLM.from_pretrained(model_dir, dtype=torch.float64, attn_implementation="eager").eval()
    return model, load_mtp_head(model_dir, torch.float64)


@torch.no_grad()
def nocache_logits_and_hidden(model, ids: torch.Tensor):
    out = model.model(input_ids=ids[None], use_cache=False)
    h = out.last_hidden_state[0]  # post-final-norm: what lm_head reads
    return model.lm_head(h), h


@torch.no_grad()
def cache_vs_nocache(model, ids: torch.Tensor, prefill: int) -> float:
    """Prefill ids[:prefill] with a cache, then feed the rest one token at a time; compare
    every position's logits with the no-cache forward. Returns max |diff|."""
    ref, _ = nocache_logits_and_hidden(model, ids)
    out = model(input_ids=ids[None, :prefill], use_cache=True)
    cache, got = out.past_key_values, [out.logits[0]]
    for t in range(prefill, ids.shape[0]):
        out = model(input_ids=ids[None, t : t + 1], past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        got.append(out.logits[0])
    return float((torch.cat(got) - ref).abs().max())


@torch.no_grad()
def mtp_layer_vs_transformers(model, head: MtpHead, T: int = 11) -> float:
    """Our FullAttentionDecoderLayer vs transformers' Qwen3_5DecoderLayer (full attention)
    on the same weights and input, positions 0..T-1, causal. Returns max |diff|."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer

    cfg = model.config
    full_idx = cfg.layer_types.index(FULL)
    ref_layer = Qwen3_5DecoderLayer(cfg, full_idx).eval()
    ref_layer.load_state_dict(head.layers[0].state_dict(), strict=True)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1, T, cfg.hidden_size, generator=g)
    pos = torch.arange(T)
    # transformers' text rotary takes [3, B, T] (mrope sections, identical for text).
    cos, sin = model.model.rotary_emb(x, pos.view(1, 1, T).expand(3, 1, T))
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
    ref = ref_layer(x, position_embeddings=(cos, sin), attention_mask=mask, position_ids=pos[None])
    ours = head.layers[0](x, pos[None], None, 0)
    return float((ref - ours).abs().max())


@torch.no_grad()
def mtp_incremental_vs_onepass(model, head: MtpHead, ids: torch.Tensor) -> float:
    """Rows 0..T-2 in one pass vs rows 0..T-3 then row T-2 alone through the KV cache."""
    T = ids.shape[0]
    if T < 3:
        return 0.0
    _, h = nocache_logits_and_hidden(model, ids)
    emb, lm = model.model.embed_tokens, model.lm_head
    full = mtp_row_logits(head, emb, lm, h, ids)
    cache = head.new_cache()
    head(h[None, : T - 2], emb(ids[None, 1 : T - 1]), torch.arange(T - 2), cache)
    last = lm(head(h[None, T - 2 : T - 1], emb(ids[None, T - 1 : T]), torch.tensor([T - 2]), cache))[0, 0]
    return float((full[T - 2] - last).abs().max())


def run_checks(model_dir: str, tol: float = 1e-4):
    """tol applies to the MTP checks; the HF cache check uses HF_PATH_TOL."""
    model, head = load_model(model_dir)
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(123)
    ids = torch.randint(0, V, (29,), generator=g)
    d_cache = max(cache_vs_nocache(model, ids, p) for p in (1, 7, 20))
    d_layer = mtp_layer_vs_transformers(model, head)
    d_inc = mtp_incremental_vs_onepass(model, head, ids)
    logits, _ = nocache_logits_and_hidden(model, ids)
    p = torch.softmax(logits, -1)
    print(f"[check {model_dir}] cache-vs-nocache max|d|={d_cache:.2e}  "
          f"mtp-layer-vs-HF max|d|={d_layer:.2e}  mtp-incremental-vs-onepass max|d|={d_inc:.2e}")
    print(f"[check {model_dir}] logits std={logits.std():.2f}  mean top-1 prob={p.max(-1).values.mean():.2f}  "
          f"distinct argmax over 29 rows={len(set(logits.argmax(-1).tolist()))}")
    bad = [n for n, d, t in (("cache", d_cache, HF_PATH_TOL), ("mtp-layer", d_layer, tol),
                             ("mtp-incremental", d_inc, tol)) if d > t]
    if bad:
        raise SystemExit(f"FAILED checks: {bad}")


def cmd_check(args):
    run_checks(args.model)


# ----------------------------------------------------------------------------- fixtures


def round_floats(t: torch.Tensor):
    """Nested lists of floats with 7 significant digits (keeps fixtures small; fp32 has ~7.2)."""
    return json.loads(json.dumps(t.tolist(), allow_nan=False), parse_float=lambda s: float(f"{float(s):.7g}"))


def read_prompts(args, model_dir: str, V: int):
    if args.prompts_file:
        if args.prompts_file.endswith(".json"):
            with open(args.prompts_file) as f:
                items = json.load(f)
        else:
            with open(args.prompts_file) as f:
                items = [ln.rstrip("\n").replace("\\n", "\n") for ln in f if ln.strip()]
        prompts = []
        for it in items:
            if isinstance(it, str):
                from tokenizers import Tokenizer

                tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
                it = tok.encode(it, add_special_tokens=False).ids
            prompts.append([int(x) for x in it])
        return prompts
    lens = [int(x) for x in str(args.prompt_len).split(",")]
    g = torch.Generator().manual_seed(args.seed)
    return [torch.randint(0, V, (lens[i % len(lens)],), generator=g).tolist() for i in range(args.random_prompts)]


@torch.no_grad()
def greedy_generate(model, ids: torch.Tensor, n: int):
    """HF's own greedy decode (cache path). EOS stopping is switched off so every prompt
    yields exactly n tokens: the engine under test is compared on pure argmax chains."""
    from transformers import GenerationConfig

    model.generation_config.eos_token_id = None
    gc = GenerationConfig(do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None,
                          pad_token_id=0, use_cache=True, output_logits=True, return_dict_in_generate=True)
    out = model.generate(input_ids=ids[None], attention_mask=torch.ones_like(ids[None]), generation_config=gc)
    seq = out.sequences[0, ids.shape[0]:]
    step_logits = torch.stack([lg[0] for lg in out.logits])  # raw logits, [n, V]
    assert seq.shape[0] == n, f"generate returned {seq.shape[0]} tokens, wanted {n}"
    return seq, step_logits


@torch.no_grad()
def check_prompt(model, head, ids, logits, hidden, greedy, step_logits, mtp_logits, chain,
                 tol=1e-4, hf_tol=HF_PATH_TOL):
    """The fixture's parts must agree with each other, not only with themselves.
    hf_tol: transformers' cache path (recurrent delta rule) vs its no-cache path (chunked)
    differ by fp32 rounding, ~1e-4 absolute on logits of magnitude ~15 (both are equally far
    from a float64 evaluation); the MTP checks compare the same math and use tol."""
    T = ids.shape[0]
    emb, lm = model.model.embed_tokens, model.lm_head
    # generate's first step is the no-cache argmax at T-1; its logits match the no-cache pass.
    assert int(greedy[0]) == int(logits[T - 1].argmax()), "greedy[0] != argmax(logits[T-1])"
    full_seq = torch.cat([ids, greedy])
    ref, _ = nocache_logits_and_hidden(model, full_seq)
    d_gen = float((ref[T - 1 : T - 1 + greedy.shape[0]] - step_logits).abs().max())
    assert d_gen < hf_tol, f"generate logits vs no-cache: {d_gen}"
    # MTP: chain step 1 == the one-pass MTP forward over T rows whose last row is (h_{T-1}, t_T).
    ext_ids = torch.cat([ids, greedy[:1]])
    ext_rows = mtp_row_logits(head, emb, lm, hidden, ext_ids)  # rows 0..T-1
    d_chain = float((ext_rows[T - 1] - chain[1][0]).abs().max())
    assert d_chain < tol, f"chain step 1 vs one-pass row T-1: {d_chain}"
    if T >= 2:
        d_rows = float((ext_rows[: T - 1] - mtp_logits).abs().max())
        assert d_rows < tol, f"mtp rows vs extended one-pass: {d_rows}"
    # Row T-2 via the cache machinery (rows 0..T-3 cached, then row T-2 alone).
    d_inc = mtp_incremental_vs_onepass(model, head, ids)
    assert d_inc < tol, f"mtp incremental row T-2: {d_inc}"
    # Step 2 of the chain by hand: (h'_1, draft_1) at position T, attending to rows 0..T-1.
    if len(chain[0]) >= 2:
        cache = head.new_cache()
        ext_h = torch.cat([hidden, chain[2][:1]])  # rows 0..T-1: true hiddens; row T: h'_1
        ext2 = torch.cat([ext_ids, torch.tensor(chain[0][:1])])  # ..., t_T, draft_1
        head(ext_h[None, :T], emb(ext2[None, 1 : T + 1]), torch.arange(T), cache)
        hp2 = head(ext_h[None, T : T + 1], emb(ext2[None, T + 1 : T + 2]), torch.tensor([T]), cache)
        d2 = float((lm(hp2)[0, 0] - chain[1][1]).abs().max())
        assert d2 < tol, f"chain step 2 by hand: {d2}"
    return d_gen, d_chain


def config_summary(cfg: dict, model_dir: str) -> dict:
    t = cfg.get("text_config", cfg)
    mc = MtpConfig.from_hf_dict(cfg)
    return {
        "vocab_size": t["vocab_size"], "hidden_size": t["hidden_size"],
        "intermediate_size": t["intermediate_size"], "num_hidden_layers": t["num_hidden_layers"],
        "layer_types": ["full" if x == FULL else "linear" for x in t["layer_types"]],
        "num_attention_heads": mc.num_attention_heads, "num_key_value_heads": mc.num_key_value_heads,
        "head_dim": mc.head_dim, "partial_rotary_factor": mc.partial_rotary_factor,
        "rotary_dim": mc.rotary_dim, "rope_theta": mc.rope_theta,
        "linear_num_key_heads": t["linear_num_key_heads"], "linear_num_value_heads": t["linear_num_value_heads"],
        "linear_key_head_dim": t["linear_key_head_dim"], "linear_value_head_dim": t["linear_value_head_dim"],
        "linear_conv_kernel_dim": t["linear_conv_kernel_dim"], "rms_norm_eps": mc.rms_norm_eps,
        "tie_word_embeddings": t.get("tie_word_embeddings", False),
        "weights_dtype": cfg.get("dtype", t.get("dtype")),
        "mtp_num_hidden_layers": cfg.get("mtp_num_hidden_layers", 0),
    }


def cmd_fixtures(args):
    import transformers

    torch.manual_seed(args.seed)
    model, head = load_model(args.model)
    # A float64 evaluation of the same weights measures how far fp32 itself is from exact,
    # which gives the C++ tests a principled tolerance (recorded per prompt).
    model64, head64 = model_as_float64(args.model)
    cfg = read_config(args.model)
    V = model.config.vocab_size
    emb, lm = model.model.embed_tokens, model.lm_head
    prompts = read_prompts(args, args.model, V)
    items = []
    for i, p in enumerate(prompts):
        ids = torch.tensor(p, dtype=torch.long)
        T = ids.shape[0]
        assert T >= 1, "empty prompt"
        logits, hidden = nocache_logits_and_hidden(model, ids)
        greedy, step_logits = greedy_generate(model, ids, args.gen)
        top2 = step_logits.topk(2, dim=-1).values
        margin = top2[:, 0] - top2[:, 1]
        mtp_logits = mtp_row_logits(head, emb, lm, hidden, ids)
        chain = mtp_draft_chain(head, emb, lm, hidden, ids, int(greedy[0]), args.mtp_k)
        d_gen, d_chain = check_prompt(model, head, ids, logits, hidden, greedy, step_logits, mtp_logits, chain)
        d_cache = cache_vs_nocache(model, torch.cat([ids, greedy]), max(1, T // 2))
        assert d_cache < HF_PATH_TOL, f"cache vs no-cache {d_cache}"
        logits64, hidden64 = nocache_logits_and_hidden(model64, ids)
        mtp64 = mtp_row_logits(head64, model64.model.embed_tokens, model64.lm_head, hidden64, ids)
        noise = float((logits.double() - logits64).abs().max())
        noise_mtp = float((mtp_logits.double() - mtp64).abs().max()) if T >= 2 else 0.0
        # Draft-1 agreement on the prompt (sanity signal only; random models give ~0).
        agree = float((mtp_logits.argmax(-1) == logits[1:].argmax(-1)).float().mean()) if T >= 2 else float("nan")
        print(f"[fixtures] prompt {i}: T={T} min margin={float(margin.min()):.3g} "
              f"cache-vs-nocache={d_cache:.1e} gen-vs-nocache={d_gen:.1e} chain-vs-onepass={d_chain:.1e} "
              f"fp32-vs-fp64={noise:.1e}/{noise_mtp:.1e} drafts={chain[0]} mtp-agree={agree:.2f}")
        items.append({
            "ids": p,
            "logits": round_floats(logits),
            "greedy": greedy.tolist(),
            "greedy_margin": round_floats(margin),
            "mtp_logits": round_floats(mtp_logits),
            "mtp_chain": {"start_token": int(greedy[0]), "draft_ids": chain[0], "logits": round_floats(chain[1])},
            "logits_fp32_vs_fp64_max_abs": float(f"{noise:.3g}"),
            "mtp_logits_fp32_vs_fp64_max_abs": float(f"{noise_mtp:.3g}"),
        })
    doc = {
        "model": os.path.relpath(os.path.abspath(args.model), REPO_ROOT),
        "dtype_compute": "float32",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "config_summary": config_summary(cfg, args.model),
        "gen": args.gen,
        "mtp_k": args.mtp_k,
        "greedy_stops_on_eos": False,
        "notes": "h_p = trunk hidden after the final norm; MTP row p = (h_p, t_{p+1}) at RoPE position p; "
                 "mtp_chain step 1 = (h_{T-1}, greedy[0]) at T-1, step j+1 = (h'_j, draft_j) at T-1+j.",
        "prompts": items,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"[fixtures] wrote {args.out} ({os.path.getsize(args.out) / 1024:.0f} KB, {len(items)} prompts)")


# ----------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tiny", help="write a tiny random checkpoint")
    t.add_argument("--out", required=True)
    t.add_argument("--variant", default="a", choices=sorted(VARIANTS) + ["all"])
    t.add_argument("--seed", type=int, default=1)
    f = sub.add_parser("fixtures", help="write a JSON fixture of transformers' outputs")
    f.add_argument("--model", required=True)
    f.add_argument("--out", required=True)
    f.add_argument("--prompts-file")
    f.add_argument("--random-prompts", type=int, default=4)
    f.add_argument("--prompt-len", default="1,2,9,17,24", help="length, or comma list cycled over prompts")
    f.add_argument("--seed", type=int, default=1)
    f.add_argument("--gen", type=int, default=24)
    f.add_argument("--mtp-k", type=int, default=3)
    c = sub.add_parser("check", help="cache / MTP sanity checks on a checkpoint")
    c.add_argument("--model", required=True)
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    {"tiny": cmd_tiny, "fixtures": cmd_fixtures, "check": cmd_check}[args.cmd](args)


if __name__ == "__main__":
    main()
