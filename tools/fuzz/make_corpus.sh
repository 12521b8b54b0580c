#!/usr/bin/env bash
# Regenerates the seed corpora in tools/fuzz/corpus/<target>/ (committed; a
# few small valid inputs each, from which libFuzzer mutates): protobuf
# requests from text format (protoc --encode), texts, config.json files and
# safetensors files. Run it after changing a seed below.
set -euo pipefail
cd "$(dirname "$0")/../.."
C=tools/fuzz/corpus
rm -rf "$C"
mkdir -p "$C"/{request_validation,tokenizer,model_files,burst_request}

encode() {  # TYPE PROTO OUT  (text format on stdin)
  /usr/bin/protoc --proto_path=. --encode="$1" "$2" >"$3"
}

# --- request_validation: specserve.v1.GenerateRequest
R="encode specserve.v1.GenerateRequest proto/specserve.proto"
$R "$C/request_validation/text_sampled" <<'EOF'
text: "Hello, world"
sampling { temperature: 0.7 top_k: 40 top_p: 0.9 min_p: 0.05 seed: 7 }
stopping { max_tokens: 16 stop: "\n" stop_token_ids: 6141 }
response { text: true spec_stats: true }
request_id: "req-1"
EOF
$R "$C/request_validation/ids_speculative" <<'EOF'
token_ids { ids: [1, 2, 3, 300] }
stopping { max_tokens: 8 ignore_eos: true }
speculation { enable: true k: 4 }
response { ids: true }
EOF
$R "$C/request_validation/new_session" <<'EOF'
text: "A new session"
session { capacity: 64 }
stopping { max_tokens: 32 }
EOF
$R "$C/request_validation/rewind_continuation" <<'EOF'
session { session_id: "sess-abc" mode: REWIND }
sampling { temperature: 1.0 }
EOF

# --- tokenizer: raw text
printf 'Hello, world! 123 numbers and punctuation...' >"$C/tokenizer/ascii"
printf '<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n' \
  >"$C/tokenizer/chat_template"
printf 'caf\xc3\xa9 e\xcc\x81 na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x91\x8b\r\n\t  x' \
  >"$C/tokenizer/unicode"
printf 'bad \xff\xfe utf8 \xc3 \xe2\x82 tail\xf0\x9f' >"$C/tokenizer/invalid_utf8"
printf "I'm sure they've   we'll\n\n\nDON'T" >"$C/tokenizer/contractions"

# --- model_files: config.json and safetensors files
cp tests/models/tiny_a/config.json "$C/model_files/tiny_a_config.json"
python3 - "$C/model_files" <<'EOF'
import json, struct, sys
out = sys.argv[1]

def safetensors(tensors, path):
    """tensors: name -> (dtype, shape); zero data."""
    size = {"F32": 4, "F16": 2, "BF16": 2}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = size[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    data = bytes((i * 37) & 0xFF for i in range(offset))
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)

safetensors({"a": ("F32", [2, 2]), "b": ("F16", [3]), "c": ("BF16", [1, 2])},
            f"{out}/three_dtypes.safetensors")

# A complete checkpoint for tools/fuzz/model_files_fuzzer.cc kMicroConfig:
# vocab 4, hidden 2, intermediate 2, layers [linear, full], nh = nkv = 1,
# head_dim 4, nk = nv = dk = dv = 1, conv kernel 2, untied, one MTP layer.
V, H, I, hd, nh, nkv, nk, nv, dk, dv, Kc = 4, 2, 2, 4, 1, 1, 1, 1, 1, 1, 2
key_dim, value_dim = nk * dk, nv * dv
conv_dim = 2 * key_dim + value_dim
t = {}
def layer(p, full):
    t[p + "input_layernorm.weight"] = ("F32", [H])
    t[p + "post_attention_layernorm.weight"] = ("F32", [H])
    if full:
        a = p + "self_attn."
        t[a + "q_proj.weight"] = ("F32", [2 * nh * hd, H])
        t[a + "k_proj.weight"] = ("F32", [nkv * hd, H])
        t[a + "v_proj.weight"] = ("F32", [nkv * hd, H])
        t[a + "o_proj.weight"] = ("F32", [H, nh * hd])
        t[a + "q_norm.weight"] = ("F32", [hd])
        t[a + "k_norm.weight"] = ("F32", [hd])
    else:
        a = p + "linear_attn."
        t[a + "in_proj_qkv.weight"] = ("F32", [conv_dim, H])
        t[a + "in_proj_z.weight"] = ("F32", [value_dim, H])
        t[a + "in_proj_b.weight"] = ("F32", [nv, H])
        t[a + "in_proj_a.weight"] = ("F32", [nv, H])
        t[a + "conv1d.weight"] = ("F32", [conv_dim, 1, Kc])
        t[a + "dt_bias"] = ("F32", [nv])
        t[a + "A_log"] = ("F32", [nv])
        t[a + "norm.weight"] = ("F32", [dv])
        t[a + "out_proj.weight"] = ("F32", [H, value_dim])
    t[p + "mlp.gate_proj.weight"] = ("F32", [I, H])
    t[p + "mlp.up_proj.weight"] = ("F32", [I, H])
    t[p + "mlp.down_proj.weight"] = ("F32", [H, I])
t["model.embed_tokens.weight"] = ("BF16", [V, H])
layer("model.layers.0.", False)
layer("model.layers.1.", True)
t["model.norm.weight"] = ("F32", [H])
t["lm_head.weight"] = ("BF16", [V, H])
t["mtp.fc.weight"] = ("F32", [H, 2 * H])
for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
    t[f"mtp.{n}.weight"] = ("F32", [H])
layer("mtp.layers.0.", True)
safetensors(t, f"{out}/micro_model.safetensors")
EOF

# --- burst_request: specserve.worker.v1.BurstRequest on session "s"
B="encode specserve.worker.v1.BurstRequest proto/worker.proto"
$B "$C/burst_request/greedy_plain" <<'EOF'
session_id: "s" max_new: 4
EOF
$B "$C/burst_request/greedy_spec_suffix" <<'EOF'
session_id: "s" suffix: [17, 18, 19] max_new: 8 k: 3 stop_token_ids: 0
EOF
$B "$C/burst_request/sampled_spec" <<'EOF'
session_id: "s" max_new: 6 k: 2
sampling { temperature: 0.8 top_k: 20 top_p: 0.9 min_p: 0.01 seed: 42 }
EOF
$B "$C/burst_request/sampled_offloaded_rewind" <<'EOF'
session_id: "s" rewind: true suffix: [3] max_new: 5 k: 4
sampling { temperature: 1.0 seed: 7 }
EOF
$B "$C/burst_request/inject_nan" <<'EOF'
session_id: "s" max_new: 6 k: 1 inject_nan_at: 3
EOF
$B "$C/burst_request/logprobs_spec_suffix" <<'EOF'
session_id: "s" suffix: [9, 200] max_new: 7 k: 3 logprobs: 5 prompt_logprobs: 2
sampling { temperature: 0.9 seed: 3 }
EOF
ls -l "$C"/*
