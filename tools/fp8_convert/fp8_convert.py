#!/usr/bin/env python3
"""Writes an FP8 checkpoint in Qwen's layout from a bf16/f16/f32 one.

    tools/fp8_convert/fp8_convert.py --src models/default --out /tmp/default-fp8
        [--block 128]

The layout (what worker/model_files/checkpoint.h reads, as vLLM and SGLang
do): every linear projection of the decoder layers and the MTP layers
(attention q/k/v/o, the MLP's gate/up/down, the linear-attention in_proj_qkv,
in_proj_z and out_proj) is stored as F8_E4M3 with a float32
`<name>_scale_inv` of shape [ceil(rows/B), ceil(cols/B)]: the weight is
fp8 x its BxB block's scale (B = 128 as Qwen ships; tests/models/tiny_a_fp8
uses 16 so that its small matrices hold many blocks). config.json gains quantization_config
(quant_method "fp8", weight_block_size [B, B], activation_scheme
"dynamic", modules_to_not_convert: the projections left in the source type,
the embedding, lm_head, the small in_proj_a/in_proj_b gates and mtp.fc).
Everything else is copied as it was; the other files of the folder too.

Quantization per block: scale = max|w| / 448 (1 for an all-zero block), and
each w / scale rounded to the nearest float8_e4m3fn value (ties to even).
Pure numpy; the one file with no dependency on the repository's code.
"""
import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np

FP8_MAX = 448.0
QUANTIZED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
             "down_proj", "in_proj_qkv", "in_proj_z", "out_proj")
NOT_CONVERTED = ["lm_head", "embed_tokens", "in_proj_a", "in_proj_b", "mtp.fc"]


def e4m3_values():
    """The 254 finite float8_e4m3fn values by code (0x7f and 0xff are NaN)."""
    codes = np.arange(256, dtype=np.uint32)
    sign = np.where(codes >> 7, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    mant = codes & 0x7
    mag = np.where(exp == 0, mant / 8.0 * 2.0 ** -6,
                   (1.0 + mant / 8.0) * 2.0 ** (exp.astype(np.float64) - 7))
    vals = sign * mag
    vals[(exp == 0xF) & (mant == 0x7)] = np.nan
    return vals


_VALS = e4m3_values()
# The non-negative codes 0x00..0x7e in increasing value, for rounding.
_POS = _VALS[:0x7F]


def to_e4m3(x):
    """float64 array (|x| <= 448) -> uint8 codes, round to nearest, ties to
    the even code."""
    a = np.abs(x)
    hi = np.clip(np.searchsorted(_POS, a, side="left"), 0, 0x7E)
    lo = np.clip(hi - 1, 0, 0x7E)
    d_lo, d_hi = a - _POS[lo], _POS[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo).astype(np.uint8)
    return np.where(x < 0, code | 0x80, code).astype(np.uint8)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = np.frombuffer(data[b:end], dtype=np.uint8)
        dt, shape = e["dtype"], e["shape"]
        if dt == "BF16":
            arr = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dt == "F16":
            arr = raw.view(np.float16).astype(np.float32)
        elif dt == "F32":
            arr = raw.view(np.float32)
        else:
            sys.exit("%s: tensor %s has dtype %s; the source must be "
                     "BF16, F16 or F32" % (path, name, dt))
        out[name] = (dt, np.array(arr).reshape(shape), raw)
    return out


def write_safetensors(path, tensors):
    """tensors: name -> (dtype string, shape, bytes)."""
    header, offset = {}, 0
    for name, (dt, shape, data) in tensors.items():
        header[name] = {"dtype": dt, "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _, (_, _, data) in tensors.items():
            f.write(data)


def quantized(name, arr):
    return arr.ndim == 2 and any(name.endswith("." + m + ".weight")
                                 for m in QUANTIZED)


def quantize(w, block):
    """(codes uint8 [R, C], scales float32 [ceil(R/block), ceil(C/block)])."""
    rows, cols = w.shape
    br, bc = -(-rows // block), -(-cols // block)
    padded = np.zeros((br * block, bc * block), dtype=np.float64)
    padded[:rows, :cols] = w
    blocks = padded.reshape(br, block, bc, block)
    amax = np.abs(blocks).max(axis=(1, 3))
    scale = np.where(amax > 0, amax / FP8_MAX, 1.0).astype(np.float32)
    q = blocks / scale.astype(np.float64)[:, None, :, None]
    codes = to_e4m3(np.clip(q, -FP8_MAX, FP8_MAX))
    return codes.reshape(br * block, bc * block)[:rows, :cols], scale


def convert(src, out, block=128):
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(src):
        p = os.path.join(src, f)
        if os.path.isfile(p) and not f.endswith(".safetensors") and f != "config.json":
            shutil.copy(p, os.path.join(out, f))
    files = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))
    index_path = os.path.join(src, "model.safetensors.index.json")
    index = json.load(open(index_path)) if os.path.exists(index_path) else None
    count = 0
    for f in files:
        tensors = {}
        for name, (dt, arr, raw) in read_safetensors(os.path.join(src, f)).items():
            if quantized(name, arr):
                codes, scale = quantize(arr.astype(np.float64), block)
                tensors[name] = ("F8_E4M3", arr.shape, codes.tobytes())
                tensors[name + "_scale_inv"] = ("F32", scale.shape, scale.tobytes())
                if index is not None:
                    index["weight_map"][name + "_scale_inv"] = f
                count += 1
            else:
                tensors[name] = (dt, arr.shape, raw.tobytes())
        write_safetensors(os.path.join(out, f), tensors)
    if index is not None:
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as fh:
            json.dump(index, fh, indent=2)
    config = json.load(open(os.path.join(src, "config.json")))
    config["quantization_config"] = {
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
        "weight_block_size": [block, block],
        "modules_to_not_convert": NOT_CONVERTED}
    with open(os.path.join(out, "config.json"), "w") as fh:
        json.dump(config, fh, indent=2)
    return count


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", required=True, help="model folder (bf16/f16/f32)")
    ap.add_argument("--out", required=True, help="folder to write")
    ap.add_argument("--block", type=int, default=128,
                    help="block rows = columns (Qwen: 128)")
    args = ap.parse_args(argv)
    n = convert(args.src, args.out, args.block)
    print("fp8_convert: %d matrices in FP8 -> %s" % (n, args.out))


if __name__ == "__main__":
    main(sys.argv[1:])
