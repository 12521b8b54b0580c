#!/usr/bin/env python3
"""hf_generate: Hugging Face transformers' greedy generate on the GPU, the
baseline beside tools/cuda_bench (benchmark (e) of tools/cuda_bench.sh).

  python3 tools/cuda_bench/hf_generate.py --json OUT.json \
      [--default-model models/default --prompt-ids 1,324,... --max-new 128 \
       --our-ids-file ids.txt] [--big --big-new 8]

1. --default-model: the checkpoint in float32 (bf16 weights upcast, eager
   attention, TF32 off: the same math as our fp32-activation forward),
   greedy generate of --max-new tokens with EOS stopping off; prints the ids,
   decode tokens/s (generate(N) minus generate(1), both timed after a warm-up)
   and, given --our-ids-file (a line "ids: a,b,c" or "a,b,c"), how many
   leading tokens equal ours.
2. --big: a random-bf16 Qwen3.5-27B-shape model (the config of
   tools/cuda_bench/random_model.cc) built on the GPU; decode tokens/s of
   greedy generate after a 32-token prompt.
Exit status 0 unless something failed to run (a token mismatch is reported,
not fatal: near ties may legitimately differ between implementations).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch


DEVICE = "cuda"


def sync_time() -> float:
    if DEVICE != "cpu":
        torch.cuda.synchronize()
    return time.perf_counter()


def greedy(model, ids: torch.Tensor, n: int) -> torch.Tensor:
    """transformers generate, greedy, exactly n new tokens (no EOS stop)."""
    out = model.generate(
        ids,
        max_new_tokens=n,
        min_new_tokens=0,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        use_cache=True,
    )
    return out[0, ids.shape[1]:]


def decode_rate(model, ids: torch.Tensor, n: int, reps: int = 2) -> tuple[float, float]:
    """(decode tok/s, prefill+first-token seconds): generate(n) - generate(1)."""
    greedy(model, ids, 2)  # warm-up (kernels, caches)
    t1s, tns = [], []
    for _ in range(reps):
        t0 = sync_time()
        greedy(model, ids, 1)
        t1s.append(sync_time() - t0)
        t0 = sync_time()
        greedy(model, ids, n)
        tns.append(sync_time() - t0)
    t1, tn = min(t1s), min(tns)
    return (n - 1) / max(tn - t1, 1e-9), t1


def default_model(args, result: dict) -> None:
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = AutoModelForCausalLM.from_pretrained(
        args.default_model, dtype=torch.float32, attn_implementation="eager"
    ).to(DEVICE).eval()
    model.generation_config.eos_token_id = None
    prompt = [int(x) for x in args.prompt_ids.split(",")]
    ids = torch.tensor([prompt], device=DEVICE)
    with torch.inference_mode():
        toks = greedy(model, ids, args.max_new).tolist()
        rate, first = decode_rate(model, ids, args.max_new)
    r = {"ids": toks, "decode_tok_s": rate, "prefill_plus_first_s": first,
         "max_new": args.max_new}
    print("hf default model ids: " + ",".join(map(str, toks)))
    print(f"hf default model: greedy decode {rate:.1f} tok/s (fp32, eager)")
    if args.our_ids_file:
        line = open(args.our_ids_file).read().strip().splitlines()
        line = [l for l in line if l.startswith("ids: ")] or line
        ours = [int(x) for x in line[0].replace("ids: ", "").split(",") if x]
        same = 0
        for a, b in zip(ours, toks):
            if a != b:
                break
            same += 1
        r["our_ids"] = ours
        r["same_prefix"] = same
        r["same_all"] = ours == toks
        print(f"hf vs ours: {same}/{len(toks)} leading tokens equal"
              f" ({'identical' if ours == toks else 'DIFFER'})")
    result["default_model"] = r
    del model
    torch.cuda.empty_cache()


def big_model(args, result: dict) -> None:
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(64)]
    cfg = Qwen3_5TextConfig(
        vocab_size=248320, hidden_size=5120, intermediate_size=17408,
        num_hidden_layers=64, layer_types=types, num_attention_heads=24,
        num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
        linear_num_value_heads=48, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
        tie_word_embeddings=False, max_position_embeddings=262144,
        rope_parameters={"rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "rope_type": "default"},
        eos_token_id=None,
    )
    t0 = time.perf_counter()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen3_5ForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    g = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-0.02, 0.02, generator=g)
    model.eval()
    model.generation_config.eos_token_id = None
    nparams = sum(p.numel() for p in model.parameters())
    build_s = sync_time() - t0
    print(f"hf 27B shape: {nparams / 1e9:.2f} B params bf16 built on the GPU in {build_s:.1f} s")
    prompt = [1 + (i * 7919) % 200000 for i in range(32)]
    ids = torch.tensor([prompt], device="cuda")
    with torch.inference_mode():
        rate, first = decode_rate(model, ids, args.big_new, reps=1)
    print(f"hf 27B shape: greedy decode {rate:.2f} tok/s = {1e3 / rate:.1f} ms/token"
          f" (bf16, default attention; {args.big_new} tokens after a 32-token prompt)")
    result["model_27b"] = {"decode_tok_s": rate, "decode_ms": 1e3 / rate,
                           "params": nparams, "new_tokens": args.big_new,
                           "prefill_plus_first_s": first}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="hf_generate.json")
    ap.add_argument("--default-model")
    ap.add_argument("--prompt-ids", default="1,324,313,2765,5811,7,2365,11,1871,323,258,744,269,1479,1")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--our-ids-file")
    ap.add_argument("--big", action="store_true")
    ap.add_argument("--big-new", type=int, default=8)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu to try the script")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    import transformers

    result = {"transformers": transformers.__version__, "torch": torch.__version__,
              "device": torch.cuda.get_device_name(0) if DEVICE != "cpu" else "cpu"}
    failed = False
    for name, fn, on in (("default", default_model, bool(args.default_model)),
                         ("27b", big_model, args.big)):
        if not on:
            continue
        try:
            fn(args, result)
        except Exception as e:  # report and go on to the next part
            failed = True
            print(f"hf {name}: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
            result[f"{name}_error"] = f"{type(e).__name__}: {e}"
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
