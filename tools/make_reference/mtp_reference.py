"""Reference PyTorch implementation of the Qwen3.5-style MTP (multi-token prediction) head.

This is the ONE implementation of the MTP head in the repository's Python tooling: the
fixture generator (tools/make_reference/make_reference.py) uses it to write the draft
logits the C++ engine is checked against, and the small-model trainer
(tools/train_small_model/train.py) imports it so the head it trains is exactly the head
the fixtures describe. transformers ignores `mtp.*` on load, so nothing upstream can be
the oracle here; the semantics follow docs/MODEL.md ("MTP head"):

  row p takes h_p (trunk hidden AFTER the final norm, what lm_head reads) and t_{p+1}:
    u  = fc(concat[RMSNorm_emb(embed(t_{p+1})), RMSNorm_hid(h_p)])      (embedding first)
    h' = mtp.norm(DecoderLayer(u)) at RoPE position p, causal over rows 0..p
    logits = lm_head(h')                                             (predicts t_{p+2})
  chaining: next row's inputs are (h' of the previous step, the drafted token), position+1,
  its K/V appended to the MTP layer's cache (whose committed rows come from true trunk
  hiddens).

The decoder layer is written out here (not borrowed from transformers) on purpose: it is
an independent statement of the gated full-attention layer, and make_reference.py checks
it against transformers' own Qwen3_5DecoderLayer on the same weights, so a mistake in
either shows up. All RMSNorms here are zero-centred (y = x̂·(1+w), computed in fp32).

Also here: helpers that read the text config, load `mtp.*` tensors from a checkpoint
directory (single file or sharded with an index), and write a checkpoint (trunk +
`mtp.*`) as safetensors shards with an index, since save_pretrained cannot carry tensors
that are not part of the transformers module.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

MTP_PREFIX = "mtp."


# ----------------------------------------------------------------------------- config


@dataclass
class MtpConfig:
    """The fields of the text config the MTP head needs (same as the trunk's full-attention layers)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    partial_rotary_factor: float
    num_layers: int = 1

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @staticmethod
    def from_hf_dict(cfg: dict) -> "MtpConfig":
        """Reads a config.json dict; text fields may be top-level or under text_config."""
        t = cfg.get("text_config", cfg)
        rope = t.get("rope_parameters") or {}
        theta = rope.get("rope_theta", t.get("rope_theta", 10000.0))
        prf = rope.get("partial_rotary_factor", t.get("partial_rotary_factor", 0.25))
        head_dim = t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"]
        return MtpConfig(
            hidden_size=t["hidden_size"],
            intermediate_size=t["intermediate_size"],
            num_attention_heads=t["num_attention_heads"],
            num_key_value_heads=t["num_key_value_heads"],
            head_dim=head_dim,
            rms_norm_eps=t.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            partial_rotary_factor=float(prf),
            num_layers=int(t.get("mtp_num_hidden_layers", cfg.get("mtp_num_hidden_layers", 1)) or 1),
        )

    @staticmethod
    def from_hf_config(config) -> "MtpConfig":
        """Same, from a transformers config object (the trunk's)."""
        return MtpConfig.from_hf_dict(config.to_dict())


# ----------------------------------------------------------------------------- layers


class ZeroCentredRMSNorm(nn.Module):
    """y = x·rsqrt(mean(x²)+eps)·(1+w) in fp32, cast back to the input dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, rotary_dim: int, theta: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape [..., rotary_dim] for integer positions (rotate-half layout), fp32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=positions.device) / rotary_dim))
    freqs = positions.float()[..., None] * inv_freq  # [..., rot/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, heads, T, hd]; cos/sin: [B, T, rot]. Rotates the first rot dims, passes the rest."""
    rot = cos.shape[-1]
    cos = cos[:, None].to(x.dtype)
    sin = sin[:, None].to(x.dtype)
    xr, xp = x[..., :rot], x[..., rot:]
    x1, x2 = xr[..., : rot // 2], xr[..., rot // 2 :]
    rotated = torch.cat([-x2, x1], dim=-1)
    return torch.cat([xr * cos + rotated * sin, xp], dim=-1)


class KVCache:
    """Per-layer post-RoPE K and V, each [B, nkv, L, hd]. Row index == RoPE position for MTP."""

    def __init__(self, num_layers: int):
        self.k: List[Optional[torch.Tensor]] = [None] * num_layers
        self.v: List[Optional[torch.Tensor]] = [None] * num_layers

    def length(self, layer: int = 0) -> int:
        return 0 if self.k[layer] is None else self.k[layer].shape[2]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.k[layer] is None:
            self.k[layer], self.v[layer] = k, v
        else:
            self.k[layer] = torch.cat([self.k[layer], k], dim=2)
            self.v[layer] = torch.cat([self.v[layer], v], dim=2)
        return self.k[layer], self.v[layer]


class GatedAttention(nn.Module):
    """Gated full attention (docs/MODEL.md): q_proj emits [query | gate] interleaved per head."""

    def __init__(self, c: MtpConfig):
        super().__init__()
        self.c = c
        H, nh, nkv, hd = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(H, 2 * nh * hd, bias=False)
        self.k_proj = nn.Linear(H, nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.q_norm = ZeroCentredRMSNorm(hd, c.rms_norm_eps)
        self.k_norm = ZeroCentredRMSNorm(hd, c.rms_norm_eps)

    def forward(self, x, positions, cache: Optional[KVCache], layer_idx: int, use_sdpa: bool):
        c = self.c
        B, T, _ = x.shape
        nh, nkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        qg = self.q_proj(x).view(B, T, nh, 2 * hd)
        q, gate = qg[..., :hd], qg[..., hd:]  # per head: first hd query, second hd gate
        gate = gate.reshape(B, T, nh * hd)
        q = self.q_norm(q).transpose(1, 2)  # [B, nh, T, hd]
        k = self.k_norm(self.k_proj(x).view(B, T, nkv, hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, nkv, hd).transpose(1, 2)
        cos, sin = rope_cos_sin(positions, c.rotary_dim, c.rope_theta)
        q = apply_partial_rope(q, cos, sin)
        k = apply_partial_rope(k, cos, sin)
        past = 0
        if cache is not None:
            past = cache.length(layer_idx)
            k, v = cache.append(layer_idx, k, v)
        rep = nh // nkv  # query head h reads kv head h // rep
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        L = k.shape[2]
        if use_sdpa and past == 0:
            # Training path: fused causal attention; same math as the eager branch.
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=hd ** -0.5)
        else:
            # Reference path: query row i (absolute row past+i) sees key rows 0..past+i.
            scores = torch.matmul(q, k.transpose(2, 3)) * (hd ** -0.5)
            qi = torch.arange(T, device=x.device)[:, None] + past
            kj = torch.arange(L, device=x.device)[None, :]
            scores = scores.masked_fill(kj > qi, float("-inf"))
            probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
            o = torch.matmul(probs, v)
        o = o.transpose(1, 2).reshape(B, T, nh * hd)
        return self.o_proj(o * torch.sigmoid(gate))


class SwiGluMlp(nn.Module):
    def __init__(self, c: MtpConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class FullAttentionDecoderLayer(nn.Module):
    """Pre-norm block; names match the trunk's full-attention layers (model.layers.i.*)."""

    def __init__(self, c: MtpConfig):
        super().__init__()
        self.input_layernorm = ZeroCentredRMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = GatedAttention(c)
        self.post_attention_layernorm = ZeroCentredRMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = SwiGluMlp(c)

    def forward(self, x, positions, cache, layer_idx, use_sdpa=False):
        x = x + self.self_attn(self.input_layernorm(x), positions, cache, layer_idx, use_sdpa)
        return x + self.mlp(self.post_attention_layernorm(x))


# ----------------------------------------------------------------------------- MTP head


class MtpHead(nn.Module):
    """State-dict keys (without the "mtp." prefix) match vLLM's Qwen3.5 MTP layout:
    fc.weight [H,2H], pre_fc_norm_embedding.weight, pre_fc_norm_hidden.weight, norm.weight,
    layers.0.* (one full-attention decoder layer with its own MLP).
    embed_tokens and lm_head are NOT owned: they are the trunk's, passed in by the caller."""

    def __init__(self, c: MtpConfig):
        super().__init__()
        self.c = c
        H = c.hidden_size
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding = ZeroCentredRMSNorm(H, c.rms_norm_eps)
        self.pre_fc_norm_hidden = ZeroCentredRMSNorm(H, c.rms_norm_eps)
        self.layers = nn.ModuleList([FullAttentionDecoderLayer(c) for _ in range(c.num_layers)])
        self.norm = ZeroCentredRMSNorm(H, c.rms_norm_eps)

    def new_cache(self) -> KVCache:
        return KVCache(len(self.layers))

    def forward(self, trunk_hidden: torch.Tensor, next_token_embeds: torch.Tensor,
                positions: torch.Tensor, cache: Optional[KVCache] = None,
                use_sdpa: bool = False) -> torch.Tensor:
        """trunk_hidden h_p and next_token_embeds embed(t_{p+1}): [B, T, H]; positions: [B, T]
        (or [T]). Returns the head's normed output hidden h' [B, T, H] (lm_head(h') = logits;
        h' is also the hidden a chained next step consumes). With a cache, rows are appended
        after the cached ones and attend to them."""
        if positions.dim() == 1:
            positions = positions[None].expand(trunk_hidden.shape[0], -1)
        e = self.pre_fc_norm_embedding(next_token_embeds)
        h = self.pre_fc_norm_hidden(trunk_hidden)
        x = self.fc(torch.cat([e, h], dim=-1))  # embedding first, then hidden
        for i, layer in enumerate(self.layers):
            x = layer(x, positions, cache, i, use_sdpa)
        return self.norm(x)


# ----------------------------------------------------------------------------- drafting


@torch.no_grad()
def mtp_row_logits(head: MtpHead, embed: nn.Module, lm_head: nn.Module,
                   hidden: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Draft logits for rows p = 0..T-2 of one sequence (hidden [T,H] post-final-norm trunk
    hiddens, ids [T]): one causal pass, row p sees rows 0..p. Returns [T-1, V]."""
    T = ids.shape[0]
    if T < 2:
        return torch.zeros(0, lm_head.weight.shape[0], dtype=hidden.dtype)
    pos = torch.arange(T - 1)
    hp = head(hidden[None, : T - 1], embed(ids[None, 1:T]), pos)
    return lm_head(hp)[0]


@torch.no_grad()
def mtp_draft_chain(head: MtpHead, embed: nn.Module, lm_head: nn.Module,
                    hidden: torch.Tensor, ids: torch.Tensor, start_token: int, k: int):
    """Greedy k-step draft after a committed sequence ids[0..T-1] with trunk hiddens
    hidden[0..T-1], whose trunk-greedy next token is start_token (= t_T).
    The MTP cache is first filled with rows 0..T-2 from the true trunk hiddens; step 1 is
    row T-1 = (h_{T-1}, t_T) at position T-1; step j+1 is (h'_j, draft_j) at position T-1+j.
    Returns (draft_ids [k], logits [k, V], hiddens [k, H], cache)."""
    T = ids.shape[0]
    cache = head.new_cache()
    if T >= 2:
        head(hidden[None, : T - 1], embed(ids[None, 1:T]), torch.arange(T - 1), cache)
    h_in = hidden[None, T - 1 : T]
    tok = torch.tensor([[start_token]])
    drafts, logits, hiddens = [], [], []
    for j in range(k):
        hp = head(h_in, embed(tok), torch.tensor([T - 1 + j]), cache)
        lg = lm_head(hp)[0, 0]
        d = int(torch.argmax(lg))
        drafts.append(d)
        logits.append(lg)
        hiddens.append(hp[0, 0])
        h_in, tok = hp, torch.tensor([[d]])
    return drafts, torch.stack(logits), torch.stack(hiddens), cache


# ----------------------------------------------------------------------------- checkpoint IO


def read_config(model_dir: str) -> dict:
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


def read_tensors(model_dir: str, prefix: str = "") -> Dict[str, torch.Tensor]:
    """All tensors whose name starts with prefix, from model.safetensors or its index."""
    from safetensors import safe_open

    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for fn in files:
        with safe_open(os.path.join(model_dir, fn), "pt") as f:
            for key in f.keys():
                if key.startswith(prefix):
                    out[key] = f.get_tensor(key)
    return out


def load_mtp_head(model_dir: str, dtype=torch.float32) -> MtpHead:
    """Builds the head from config.json and loads mtp.* strictly (every tensor, right shapes)."""
    head = MtpHead(MtpConfig.from_hf_dict(read_config(model_dir)))
    sd = {k[len(MTP_PREFIX):]: v.to(dtype) for k, v in read_tensors(model_dir, MTP_PREFIX).items()}
    head.load_state_dict(sd, strict=True)
    return head.to(dtype).eval()


def save_checkpoint(model, head: MtpHead, out_dir: str, dtype: torch.dtype,
                    max_shard_bytes: Optional[int] = None, extra_config: Optional[dict] = None) -> List[str]:
    """Writes config.json (the trunk config's save_pretrained + "mtp_num_hidden_layers" and
    extra_config) and the weights: trunk state dict (lm_head dropped when tied, as
    transformers does) plus mtp.*, cast to dtype. With max_shard_bytes, tensors are packed
    in name order into model-0000i-of-0000n.safetensors files of at most that size plus
    model.safetensors.index.json; otherwise a single model.safetensors.
    Returns the written weight file names."""
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    # Stale weight files from an earlier layout (single vs sharded) would confuse loaders.
    for fn in os.listdir(out_dir):
        if fn.startswith("model") and (fn.endswith(".safetensors") or fn.endswith(".safetensors.index.json")):
            os.remove(os.path.join(out_dir, fn))
    model.config.save_pretrained(out_dir)
    cfg_path = os.path.join(out_dir, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    # config.save_pretrained alone omits architectures (model.save_pretrained adds it).
    cfg["architectures"] = [type(model).__name__]
    cfg["mtp_num_hidden_layers"] = len(head.layers)
    cfg["dtype"] = str(dtype).replace("torch.", "")
    cfg.update(extra_config or {})
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")

    tensors: Dict[str, torch.Tensor] = {}
    for k, v in model.state_dict().items():
        if k == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        tensors[k] = v.detach().to(dtype).contiguous().cpu()
    for k, v in head.state_dict().items():
        tensors[MTP_PREFIX + k] = v.detach().to(dtype).contiguous().cpu()
    names = sorted(tensors)

    def nbytes(t):
        return t.numel() * t.element_size()

    if max_shard_bytes is None:
        save_file({k: tensors[k] for k in names}, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
        os.chmod(os.path.join(out_dir, "model.safetensors"), 0o644)  # save_file creates 0600
        return ["model.safetensors"]
    shards: List[List[str]] = [[]]
    size = 0
    # The safetensors header costs a little beyond the raw bytes; keep a margin for it.
    budget = max_shard_bytes - 256 * 1024
    for k in names:
        b = nbytes(tensors[k])
        if b > budget:
            raise ValueError(f"tensor {k} ({b} bytes) exceeds the shard budget")
        if size + b > budget and shards[-1]:
            shards.append([])
            size = 0
        shards[-1].append(k)
        size += b
    n = len(shards)
    weight_map, files = {}, []
    for i, keys in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file({k: tensors[k] for k in keys}, os.path.join(out_dir, fn), metadata={"format": "pt"})
        os.chmod(os.path.join(out_dir, fn), 0o644)
        files.append(fn)
        for k in keys:
            weight_map[k] = fn
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(nbytes(t) for t in tensors.values())},
                   "weight_map": weight_map}, f, indent=2, sort_keys=True)
        f.write("\n")
    return files
